//! A structured mutation fuzzer that runs on the stable toolchain, for the parsers that take
//! bytes from outside: HTTP heads and bodies, the TOML config and `ABE_*` overrides, the
//! upstream SSE and JSON readers, the router's alias and fallback tables.
//!
//! Why not coverage-guided: cargo-fuzz needs a nightly compiler, and `cargo afl` needs its
//! own crate built against an afl++ whose LLVM plugins match rustc's; neither is in this
//! toolchain (RELIABILITY.md). What stands in for coverage is *outcome* feedback: a target
//! returns a signature of what its input did (which error, which branch of the answer), and
//! an input with a signature not seen before joins the corpus, so mutation keeps reaching
//! into the parts of the grammar that reach new outcomes.
//!
//! - [`mutate`]: byte-level and dictionary mutations of a corpus entry, from a seeded RNG.
//! - [`campaign`]: the loop: seed corpus from files, a bounded number of executions, panics
//!   caught and reported with the seed and iteration that replay them exactly.
//!
//! What must never happen here: a source of randomness other than the seed (a failure must
//! replay), or anything the server needs at run time (nothing in `abe` calls this module;
//! only its tests do).

pub mod campaign;
pub mod mutate;

pub use campaign::{seeds_from_dir, signature, Campaign, Report};
