//! Metrics export: the runtime's published [`Snapshot`](crate::runtime::Snapshot) plus the
//! HTTP server's [`HttpStats`] rendered as Prometheus text (`/metrics`) and JSON
//! (`/metrics/json`).
//!
//! The engine never calls into this module: it publishes snapshots and goes on, so the hot
//! loop never takes a lock or allocates for metrics. Rendering happens on io threads, which
//! may allocate; [`HttpStats`] is the one part io threads touch per request, and it is a set
//! of lock-free counters. Time (the engine clock in the snapshot, the wall clock for JSON
//! timestamps) is passed in; nothing here reads a clock.

pub mod derived;
pub mod events;
mod exposition;
#[cfg(test)]
mod exposition_check;
pub mod history;
pub mod http_stats;
pub mod json;
pub mod prometheus;
pub mod timestamp;
pub mod vllm;

pub use http_stats::{Endpoint, HttpStats};
