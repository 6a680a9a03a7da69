//! `parse_head` on any bytes, whole and at every prefix a server could see first: a prefix is
//! "not yet" (or, for a head that is refused, possibly refused already), never another head;
//! a head's lengths stay within the limits. Seeds: `fuzz/corpus/http/`. The same invariant
//! as the stable campaign `http_head` (`tests/fuzz_http.rs`), here with coverage guidance.
#![no_main]

use abe::fuzz::invariants;
use libfuzzer_sys::fuzz_target;

const HEADER_MAX: usize = 1024;
const BODY_MAX: usize = 4096;

fuzz_target!(|input: &[u8]| {
    let _ = invariants::http_head(input, HEADER_MAX, BODY_MAX);
});
