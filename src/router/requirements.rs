//! What a request needs from a backend: the model it names, its estimated size in tokens,
//! and whether it needs vision, tools or JSON mode.
//!
//! The API layer extracts these from the request body it has already parsed and hands them
//! over as plain values ([`Requirements::new`]), or feeds the parts one by one to a
//! [`RequirementsBuilder`], which owns the extraction rules (text parts only count toward
//! the estimate; any `image_url` part means vision; a non-empty `tools` array means tools;
//! `response_format.type == "json_object"` means JSON mode). Nothing here parses JSON,
//! allocates or copies the prompt: the model name is borrowed.

use super::capabilities::Capabilities;

/// Characters per estimated token (the spec's rough ratio).
pub const CHARS_PER_TOKEN: u64 = 4;

/// What one request needs from a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requirements<'a> {
    /// The model the request names (may be an alias); borrowed from the request.
    pub model: &'a str,
    /// Text characters / 4 (see [`estimate_tokens`]); compared with a model's
    /// `context_length`.
    pub estimated_tokens: u32,
    /// The capabilities it needs.
    pub needs: Capabilities,
    /// The LoRA adapter it runs with (`core::lora::BASE_MODEL`: none): only backends that
    /// list or loaded it are eligible, and one with it resident is preferred.
    pub adapter: crate::core::lora::AdapterId,
}

impl<'a> Requirements<'a> {
    /// From plain fields.
    pub fn new(
        model: &'a str,
        estimated_tokens: u32,
        vision: bool,
        tools: bool,
        json_mode: bool,
    ) -> Self {
        Requirements {
            model,
            estimated_tokens,
            needs: Capabilities {
                vision,
                tools,
                json_mode,
            },
            adapter: crate::core::lora::BASE_MODEL,
        }
    }

    /// A plain-text request for `model` of `estimated_tokens`.
    pub fn text(model: &'a str, estimated_tokens: u32) -> Self {
        Requirements::new(model, estimated_tokens, false, false, false)
    }
}

/// Estimated tokens for `text_chars` characters of text: `chars / 4`, saturating at
/// `u32::MAX`.
pub const fn estimate_tokens(text_chars: u64) -> u32 {
    let t = text_chars / CHARS_PER_TOKEN;
    if t > u32::MAX as u64 {
        u32::MAX
    } else {
        t as u32
    }
}

/// Collects requirements from a request's parts as the API layer walks them.
///
/// ```
/// use abe::router::RequirementsBuilder;
/// let mut b = RequirementsBuilder::new("llava");
/// b.text("What is in this picture?");  // a text part, or a whole string content
/// b.content_part("image_url");          // the type of a content part
/// b.tools(0);                           // `tools` is present but empty: not needed
/// b.response_format(Some("json_object"));
/// let r = b.build();
/// assert!(r.needs.vision && !r.needs.tools && r.needs.json_mode);
/// assert_eq!(r.estimated_tokens, 24 / 4);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RequirementsBuilder<'a> {
    model: &'a str,
    text_chars: u64,
    needs: Capabilities,
}

impl<'a> RequirementsBuilder<'a> {
    pub fn new(model: &'a str) -> Self {
        RequirementsBuilder {
            model,
            text_chars: 0,
            needs: Capabilities::default(),
        }
    }

    /// Text that counts toward the estimate: a string `content`, a `text` part, a
    /// completions `prompt`. Counted in characters (Unicode scalar values).
    pub fn text(&mut self, text: &str) -> &mut Self {
        self.text_chars = self.text_chars.saturating_add(text.chars().count() as u64);
        self
    }

    /// The `type` of one content part. `image_url` needs vision; other types add nothing
    /// (their text, if any, goes through [`text`](Self::text)).
    pub fn content_part(&mut self, part_type: &str) -> &mut Self {
        if part_type == "image_url" {
            self.needs.vision = true;
        }
        self
    }

    /// The length of the request's `tools` array (0 when absent or empty).
    pub fn tools(&mut self, count: usize) -> &mut Self {
        if count > 0 {
            self.needs.tools = true;
        }
        self
    }

    /// `response_format.type`, when present.
    pub fn response_format(&mut self, format_type: Option<&str>) -> &mut Self {
        if format_type == Some("json_object") {
            self.needs.json_mode = true;
        }
        self
    }

    pub fn build(&self) -> Requirements<'a> {
        Requirements {
            model: self.model,
            estimated_tokens: estimate_tokens(self.text_chars),
            needs: self.needs,
            adapter: crate::core::lora::BASE_MODEL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_is_chars_over_four() {
        assert_eq!(estimate_tokens(0), 0);
        assert_eq!(estimate_tokens(3), 0);
        assert_eq!(estimate_tokens(4), 1);
        assert_eq!(estimate_tokens(40_000), 10_000);
        assert_eq!(estimate_tokens(u64::MAX), u32::MAX);
    }

    #[test]
    fn text_parts_only_count_toward_the_estimate() {
        let mut b = RequirementsBuilder::new("m");
        b.text("abcd").content_part("text").text("efgh");
        b.content_part("image_url"); // the URL is not text
        let r = b.build();
        assert_eq!(r.estimated_tokens, 2);
        assert!(r.needs.vision);
    }

    #[test]
    fn characters_not_bytes() {
        let mut b = RequirementsBuilder::new("m");
        b.text("ééééàààà"); // 8 characters, 16 bytes
        assert_eq!(b.build().estimated_tokens, 2);
    }

    #[test]
    fn tools_only_when_non_empty_and_json_only_for_json_object() {
        let mut b = RequirementsBuilder::new("m");
        b.tools(0)
            .response_format(Some("text"))
            .response_format(None);
        assert_eq!(b.build().needs, Capabilities::default());
        b.tools(2).response_format(Some("json_object"));
        let n = b.build().needs;
        assert!(n.tools && n.json_mode && !n.vision);
    }

    #[test]
    fn plain_constructor() {
        let r = Requirements::new("gpt-4", 12, true, false, true);
        assert_eq!(r.model, "gpt-4");
        assert_eq!(r.estimated_tokens, 12);
        assert!(r.needs.vision && !r.needs.tools && r.needs.json_mode);
        assert_eq!(Requirements::text("m", 5).needs, Capabilities::default());
    }
}
