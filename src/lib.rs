//! abe: an adaptive batching engine for LLM inference.
//!
//! `core` is the sans-IO scheduler, `runtime` drives it with threads and a real clock,
//! `exec` holds the executors workers run. The binary (`src/main.rs`) is a thin CLI over
//! these; nothing in the library prints or exits.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod api;
pub mod buckets;
pub mod build_info;
pub mod config;
pub mod core;
pub mod dashboard;
pub mod exec;
#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
pub mod http;
pub mod latency_histogram;
pub mod live;
pub mod loadgen;
pub mod metrics;
pub mod router;
pub mod runtime;
pub mod serve;
pub mod server;
pub mod sim;
pub mod sync;
