//! Which of the request headers abe reads a header name is, case-insensitively, in a few
//! word compares.
//!
//! The head parser asks this of every header of every request. A chain of
//! `eq_ignore_ascii_case` against each known name cost ~75 instructions a header on the
//! small completion POST (callgrind, BENCHMARKS.md "The hot path again"); here a name is
//! sorted by its length, then read as one or two little-endian words, folded to lower case
//! by setting bit 5 of every byte, and compared with the known name's words.
//!
//! The fold is exact for header names: they are token characters (both parsers in front of
//! this check), and the known names are lower-case letters and `-`. Setting bit 5 maps a
//! byte to a lower-case letter only from that letter or its capital, and to `-` (0x2d) only
//! from `-` or CR (0x0d), which is not a token character. What must never happen here: a
//! name taken for a known one it is not (a test compares every one-byte change of every
//! known name, over every token character, with `eq_ignore_ascii_case`), or an allocation.

/// A request header abe reads; `Other` for every other name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderName {
    ContentLength,
    TransferEncoding,
    Host,
    Connection,
    Expect,
    XPriority,
    Authorization,
    XSessionId,
    XRequestId,
    Other,
}

/// Bit 5 of every byte: set, it lower-cases an ASCII letter.
const FOLD: u64 = 0x2020_2020_2020_2020;

/// The little-endian word of `s[at..at + width]` (`width` at most 8) with bit 5 set in
/// each of its bytes: a `const` reading of a known name.
const fn folded(s: &[u8], at: usize, width: usize) -> u64 {
    let mut w = 0u64;
    let mut i = 0;
    while i < width {
        w |= (s[at + i] as u64) << (8 * i);
        i += 1;
    }
    w | FOLD >> (64 - 8 * width)
}

/// A known name of 8 to 16 bytes as its first and last (overlapping) 8 bytes, folded (of
/// a longer one, the bytes between are compared apart).
const fn words(s: &str) -> (u64, u64) {
    let b = s.as_bytes();
    (folded(b, 0, 8), folded(b, b.len() - 8, 8))
}

const CONTENT_LENGTH: (u64, u64) = words("content-length");
const TRANSFER_ENCODING: (u64, u64) = words("transfer-encoding");
const CONNECTION: (u64, u64) = words("connection");
const X_PRIORITY: (u64, u64) = words("x-priority");
const AUTHORIZATION: (u64, u64) = words("authorization");
const X_SESSION_ID: (u64, u64) = words("x-session-id");
const X_REQUEST_ID: (u64, u64) = words("x-request-id");
const HOST: u32 = folded(b"host", 0, 4) as u32;
/// `expect` as its first and last (overlapping) 4 bytes.
const EXPECT: (u32, u32) = (
    folded(b"expect", 0, 4) as u32,
    folded(b"expect", 2, 4) as u32,
);

/// Which known header `name` is. `name` is a header name as the parsers hand it over:
/// token characters only.
pub fn classify(name: &[u8]) -> HeaderName {
    debug_assert!(name.iter().all(|&b| b != b'\r'), "not a token: {name:?}");
    let n = name.len();
    let long = || {
        let first = u64::from_le_bytes(name[..8].try_into().expect("8 bytes")) | FOLD;
        let last = u64::from_le_bytes(name[n - 8..].try_into().expect("8 bytes")) | FOLD;
        (first, last)
    };
    let short = |at: usize| u32::from_le_bytes(name[at..at + 4].try_into().expect("4 bytes"));
    match n {
        4 if short(0) | FOLD as u32 == HOST => HeaderName::Host,
        6 if (short(0) | FOLD as u32, short(2) | FOLD as u32) == EXPECT => HeaderName::Expect,
        10 => match long() {
            w if w == CONNECTION => HeaderName::Connection,
            w if w == X_PRIORITY => HeaderName::XPriority,
            _ => HeaderName::Other,
        },
        12 => match long() {
            w if w == X_REQUEST_ID => HeaderName::XRequestId,
            w if w == X_SESSION_ID => HeaderName::XSessionId,
            _ => HeaderName::Other,
        },
        13 if long() == AUTHORIZATION => HeaderName::Authorization,
        14 if long() == CONTENT_LENGTH => HeaderName::ContentLength,
        // Two words leave the ninth byte (`-`) between them.
        17 if long() == TRANSFER_ENCODING && name[8] == b'-' => HeaderName::TransferEncoding,
        _ => HeaderName::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: [(&str, HeaderName); 9] = [
        ("content-length", HeaderName::ContentLength),
        ("transfer-encoding", HeaderName::TransferEncoding),
        ("host", HeaderName::Host),
        ("connection", HeaderName::Connection),
        ("expect", HeaderName::Expect),
        ("x-priority", HeaderName::XPriority),
        ("authorization", HeaderName::Authorization),
        ("x-session-id", HeaderName::XSessionId),
        ("x-request-id", HeaderName::XRequestId),
    ];

    /// What a chain of `eq_ignore_ascii_case` says (the reading this replaces).
    fn reference(name: &[u8]) -> HeaderName {
        KNOWN
            .iter()
            .find(|(k, _)| name.eq_ignore_ascii_case(k.as_bytes()))
            .map_or(HeaderName::Other, |&(_, h)| h)
    }

    #[test]
    fn known_names_in_any_case_and_nothing_else() {
        for (k, h) in KNOWN {
            assert_eq!(classify(k.as_bytes()), h, "{k}");
            assert_eq!(classify(k.to_ascii_uppercase().as_bytes()), h, "{k}");
            // Alternating case.
            let mixed: Vec<u8> = k
                .bytes()
                .enumerate()
                .map(|(i, b)| {
                    if i % 2 == 0 {
                        b.to_ascii_uppercase()
                    } else {
                        b
                    }
                })
                .collect();
            assert_eq!(classify(&mixed), h, "{k}");
        }
        for other in [
            "content-type",
            "hosts",
            "hos",
            "",
            "accept",
            "user-agent",
            "x",
        ] {
            assert_eq!(classify(other.as_bytes()), HeaderName::Other, "{other}");
        }
    }

    /// Every single-byte change of every known name, over every token character (and the
    /// bytes bit 5 could confuse with one), reads as `eq_ignore_ascii_case` reads it.
    #[test]
    fn one_byte_changes_read_as_eq_ignore_ascii_case_reads_them() {
        let tokens: Vec<u8> = (0u8..=255)
            .filter(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b) || b >= 0x80)
            .collect();
        let mut checked = 0;
        for (k, _) in KNOWN {
            for at in 0..k.len() {
                for &b in &tokens {
                    let mut name = k.as_bytes().to_vec();
                    name[at] = b;
                    assert_eq!(classify(&name), reference(&name), "{name:?}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 9 * 4 * 70, "{checked}");
    }
}
