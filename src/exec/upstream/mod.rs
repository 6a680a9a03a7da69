//! The `upstream` executor: forwards batches to a remote OpenAI-compatible server (vLLM,
//! llama.cpp server, Ollama, TGI, another abe) over plain HTTP/1.1 with keep-alive.
//!
//! `executor` is a worker's executor, `mux` the event loop a backend's workers share (its
//! connections, `http1` their requests and answers, `resolve` its name lookups), `plan` a
//! batch as backend requests and their answers back, `wire` the OpenAI request and response
//! shapes, `sse` the stream reader, `client` the health checker's HTTP client and the
//! error messages, `slot` the cell a backend slot's client lives in (its address changes
//! when the slot is filled again). Nothing here runs on the engine thread: only the event
//! loops, workers and the health checker call into it.

mod client;
mod executor;
#[cfg(test)]
mod fuzz;
#[cfg(any(test, feature = "testing"))]
pub mod fuzzing;
mod http1;
mod mux;
mod plan;
mod resolve;
mod slot;
mod sse;
mod wire;

pub use client::{UpstreamClient, UpstreamTarget, UpstreamTimeouts};
pub use executor::UpstreamExecutor;
pub use mux::Mux;
pub use plan::CONCURRENT_REQUESTS_MAX;
pub use slot::{SlotCell, UpstreamSlot};
