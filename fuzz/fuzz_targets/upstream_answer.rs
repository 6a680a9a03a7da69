//! The JSON readers of a backend's answers (completions, chat, embeddings, stream chunks of
//! both kinds) on any text: parse or say why, never panic. Seeds:
//! `fuzz/corpus/upstream_json/`.
#![no_main]

use abe::exec::upstream::fuzzing::json_outcomes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if let Ok(text) = std::str::from_utf8(input) {
        let _ = json_outcomes(text);
    }
});
