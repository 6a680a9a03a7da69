//! `parse_head` on any bytes, whole and at every prefix a server could see first: a prefix is
//! "not yet" (or, for a head that is refused, possibly refused already), never another head;
//! a head's lengths stay within the limits. Seeds: `fuzz/corpus/http/`. The same invariant
//! as the stable campaign `http_head` (`tests/fuzz_http.rs`), here with coverage guidance.
#![no_main]

use abe::http::parse::parse_head;
use libfuzzer_sys::fuzz_target;

const HEADER_MAX: usize = 1024;
const BODY_MAX: usize = 4096;

fuzz_target!(|input: &[u8]| {
    let whole = parse_head(input, HEADER_MAX, BODY_MAX);
    if let Ok(Some(h)) = &whole {
        assert!(h.head_len <= input.len() && h.head_len <= HEADER_MAX);
        assert!(h.content_length <= BODY_MAX);
    }
    let end = match &whole {
        Ok(Some(h)) => h.head_len,
        _ => input.len(),
    };
    // Every byte for short inputs; a stride beyond (httparse rescans from the start).
    let stride = (end / 256).max(1);
    for k in (0..end).step_by(stride) {
        let prefix = parse_head(&input[..k], HEADER_MAX, BODY_MAX);
        match (&whole, &prefix) {
            (_, Ok(None)) => {}
            (Ok(Some(_)), _) => panic!("prefix of {k} bytes read {prefix:?}; whole {whole:?}"),
            (Err(_), Err(_)) => {}
            (Ok(None), Err(e)) => panic!("prefix of {k} bytes refused ({e:?}), whole not yet"),
            (_, Ok(Some(_))) => panic!("prefix of {k} bytes is a head; whole {whole:?}"),
        }
    }
});
