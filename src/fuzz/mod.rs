//! A structured mutation fuzzer that runs on the stable toolchain, for the parsers that take
//! bytes from outside: HTTP heads and bodies, the TOML config and `ABE_*` overrides, the
//! upstream SSE and JSON readers, the router's alias and fallback tables.
//!
//! Why this beside coverage guidance: cargo-fuzz needs a nightly compiler, so the
//! coverage-guided targets live in `fuzz/`, a crate outside the workspace run by
//! `tools/fuzz_coverage.sh` (RELIABILITY.md), while this fuzzer runs in the stable test
//! command. What stands in for coverage here is *outcome* feedback: a target returns a
//! signature of what its input did (which error, which branch of the answer), and an input
//! with a signature not seen before joins the corpus, so mutation keeps reaching into the
//! parts of the grammar that reach new outcomes. Both read the seeds of `fuzz/corpus/`.
//!
//! - [`mutate`]: byte-level and dictionary mutations of a corpus entry, from a seeded RNG.
//! - [`invariants`]: the properties both fuzzers check an input against.
//! - [`campaign`]: the loop: seed corpus from files, a bounded number of executions, panics
//!   caught and reported with the seed and iteration that replay them exactly.
//!
//! What must never happen here: a source of randomness other than the seed (a failure must
//! replay), or anything the server needs at run time (nothing in `abe` calls this module;
//! only its tests do, and it is built with the `testing` feature or under `cfg(test)` only).

pub mod campaign;
pub mod invariants;
pub mod mutate;

pub use campaign::{seeds_from_dir, signature, Campaign, Report};
