//! The `upstream` executor: forwards batches to a remote OpenAI-compatible server (vLLM,
//! llama.cpp server, Ollama, TGI, another abe) over plain HTTP/1.1 with keep-alive.
//!
//! `client` owns the connection pool and error mapping, `wire` the OpenAI request and
//! response shapes, `sse` the stream reader, `executor` the batch-to-requests plan, `slot` the cell a backend slot's client lives in
//! (its address changes when the slot is filled again), `resolve` the pool's name lookups. Nothing
//! here runs on the engine thread: only workers and the health checker call into it.

mod client;
mod executor;
#[cfg(test)]
mod fuzz;
#[cfg(any(test, feature = "testing"))]
pub mod fuzzing;
mod http1;
mod mux;
mod resolve;
mod slot;
mod sse;
mod wire;

pub use client::{UpstreamClient, UpstreamTarget, UpstreamTimeouts};
pub use executor::{UpstreamExecutor, CONCURRENT_REQUESTS_MAX};
pub use mux::Mux;
pub use slot::{SlotCell, UpstreamSlot};
