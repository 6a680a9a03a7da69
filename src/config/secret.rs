//! A secret config value (the admin token): kept as given, shown to nobody.
//!
//! `Debug` and `Serialize` (so `abe config show` and any log of a config) print
//! `"<redacted>"` for a set secret and `""` for an unset one (whether one is set is not a
//! secret, and the default config still round-trips). A bearer header is checked against it
//! in time that does not depend on where the first differing byte is. What must never
//! happen here: the secret's text reaching a `Display`, `Debug` or serialised form, or an
//! early exit from the comparison.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A secret string (see the module doc).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// What `Debug` and `Serialize` show instead of a set secret.
    pub const REDACTED: &'static str = "<redacted>";

    /// A secret from its text.
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// No secret set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The text itself, for whoever must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `authorization` is `Bearer <this secret>`, compared in constant time for a given
    /// secret length: every byte of the secret is looked at whatever the header holds, so the
    /// time taken says nothing about how much of a guess was right.
    pub fn matches_bearer(&self, authorization: Option<&str>) -> bool {
        let given = authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .unwrap_or("")
            .as_bytes();
        constant_time_eq(self.0.as_bytes(), given)
    }
}

/// `expected == given` without an early exit on the first difference; only the length of
/// `expected` (the server's own secret) shapes the loop.
fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != given.len());
    for (i, &e) in expected.iter().enumerate() {
        // A short guess is compared against zeros: same work, still a difference.
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= std::hint::black_box(e ^ g);
    }
    std::hint::black_box(diff) == 0
}

impl From<&str> for Secret {
    fn from(text: &str) -> Secret {
        Secret::new(text)
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            f.write_str("\"\"")
        } else {
            write!(f, "{:?}", Self::REDACTED)
        }
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.is_empty() { "" } else { Self::REDACTED })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_matches() {
        let s = Secret::new("s3cret");
        assert!(s.matches_bearer(Some("Bearer s3cret")));
        for wrong in [
            None,
            Some(""),
            Some("s3cret"),
            Some("Bearer "),
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("Bearer S3cret"),
            Some("bearer s3cret"),
            Some("Bearer s3cre\u{0}"),
        ] {
            assert!(!s.matches_bearer(wrong), "{wrong:?}");
        }
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn debug_and_serialised_forms_never_hold_the_text() {
        let s = Secret::new("tok-123");
        assert_eq!(format!("{s:?}"), "\"<redacted>\"");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"<redacted>\"");
        let unset = Secret::default();
        assert_eq!(format!("{unset:?}"), "\"\"");
        assert_eq!(serde_json::to_string(&unset).unwrap(), "\"\"");
        let back: Secret = serde_json::from_str("\"tok-123\"").unwrap();
        assert_eq!(back.expose(), "tok-123");
    }
}
