//! The properties a fuzz input is checked against, shared by the stable campaigns
//! (`tests/fuzz_*.rs`) and the coverage-guided targets (`fuzz/fuzz_targets/`), so both judge
//! an input by the same rule. Each panics on a violation and returns what the campaign needs
//! to sign the outcome. The config's own properties live beside it, in `config::fuzzing`
//! (this module sits below the config in the house).
//!
//! What must never happen here: a check only one of the two fuzzers applies.

use crate::http::parse::{parse_head, Head, HeadError};

/// `parse_head` on `input`, whole and at every prefix a server could see first: a prefix is
/// "not yet" (or, for a head that is refused, possibly refused already), never another head;
/// a head's lengths stay within the limits. Returns the whole input's reading.
pub fn http_head(
    input: &[u8],
    header_max: usize,
    body_max: usize,
) -> Result<Option<Head>, HeadError> {
    let whole = parse_head(input, header_max, body_max);
    if let Ok(Some(h)) = &whole {
        assert!(h.head_len <= input.len() && h.head_len <= header_max);
        assert!(h.content_length <= body_max);
    }
    let end = match &whole {
        Ok(Some(h)) => h.head_len,
        _ => input.len(),
    };
    // Every byte for short inputs; a stride beyond (httparse rescans from the start).
    let stride = (end / 256).max(1);
    for k in (0..end).step_by(stride) {
        let prefix = parse_head(&input[..k], header_max, body_max);
        match (&whole, &prefix) {
            (_, Ok(None)) => {}
            (Ok(Some(_)), _) => panic!("prefix of {k} bytes read {prefix:?}; whole {whole:?}"),
            (Err(_), Err(_)) => {}
            (Ok(None), Err(e)) => panic!("prefix of {k} bytes refused ({e:?}), whole not yet"),
            (_, Ok(Some(_))) => panic!("prefix of {k} bytes is a head; whole {whole:?}"),
        }
    }
    whole
}
