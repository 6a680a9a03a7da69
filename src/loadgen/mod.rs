//! `abe loadgen`: the simulator's workloads played open-loop against a live
//! OpenAI-compatible server (abe or any other), measured the way the simulator measures.
//!
//! [`run::run`] resolves a scenario (built-in or file, as `abe simulate` does), builds the
//! [`schedule::Schedule`] from the same `Workload::generate` call (same seed, same requests),
//! optionally switches the target's strategy ([`admin`]), drives a fixed pool of keep-alive
//! connections ([`client`]) with deterministic prompts ([`prompt`]), and returns a
//! [`report::LiveReport`] whose run has the simulator's `RunReport` fields.
//!
//! This sends real traffic to the given URL. Targets must be loopback unless the caller
//! allows otherwise ([`target`]). What must never happen here: coordinated omission
//! (latency is always measured from the scheduled send time), an unbounded wait (every
//! socket operation has a timeout, every schedule is finite), printing or exiting (progress
//! goes to a callback; the binary prints).

pub mod admin;
pub mod client;
pub mod error;
pub mod prompt;
pub mod report;
pub mod run;
pub mod schedule;
pub mod target;

pub use error::LoadgenError;
pub use run::{run, run_scenario, LoadgenOptions, Progress};
