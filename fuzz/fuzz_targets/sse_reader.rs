//! The upstream SSE reader on any body a backend could send: the same events read whole and
//! byte by byte (and through a buffer size the input picks), every event bounded, the end
//! of the body always reached. Seeds: `fuzz/corpus/upstream_sse/`.
#![no_main]

use abe::exec::upstream::fuzzing::sse_events;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let whole = sse_events(input, 8192);
    assert_eq!(whole, sse_events(input, 1), "byte-by-byte reads differ");
    // A third split, chosen by the input, so buffer boundaries land everywhere.
    let capacity = 2 + usize::from(input.first().copied().unwrap_or(0) % 61);
    assert_eq!(
        whole,
        sse_events(input, capacity),
        "{capacity}-byte reads differ"
    );
});
