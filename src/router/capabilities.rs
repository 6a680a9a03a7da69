//! What a model on a backend can do beyond plain text, and what a request needs of it: the
//! one vocabulary the registry (offers) and the requirements (needs) share.

use serde::{Deserialize, Serialize};

/// What a model on a backend can do beyond plain text. Also used for what a request needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Capabilities {
    /// Accepts `image_url` content parts.
    pub vision: bool,
    /// Accepts a `tools` array (function calling).
    pub tools: bool,
    /// Honours `response_format = {"type": "json_object"}`.
    pub json_mode: bool,
}

impl Capabilities {
    /// Everything `need` asks for is here.
    #[inline]
    pub const fn covers(self, need: Capabilities) -> bool {
        (self.vision || !need.vision)
            && (self.tools || !need.tools)
            && (self.json_mode || !need.json_mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_cover() {
        let all = Capabilities {
            vision: true,
            tools: true,
            json_mode: true,
        };
        let none = Capabilities::default();
        assert!(all.covers(all) && all.covers(none) && none.covers(none));
        assert!(!none.covers(Capabilities {
            tools: true,
            ..none
        }));
    }
}
