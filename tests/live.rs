//! The live integration tests, one binary: a real abe (in process, or `abe serve` as a
//! process) over real TCP on 127.0.0.1, one module per file beside this one.
//!
//! One binary instead of one per file: each test binary links the whole crate and its
//! dependencies again, and 37 of them were most of an incremental build's time. Run one
//! file's tests with `cargo test --test live http_api::` (a filter is a substring of the
//! test's path: `routing::` also runs `continuous_routing::` and `upstream_routing::`).
//! Nothing here may change the process for the others: no global allocator (that is
//! `no_alloc`'s own binary), no environment variables set, no signal handlers; a test that
//! needs a process of its own spawns `abe serve` (`sigterm`). The one process-wide setting
//! is the embed executor's (`embed_model`): it asks glibc to keep big buffers on the heap
//! (`mallopt`), which changes memory behaviour only, and no test here measures memory.

mod common;

mod auto_switch;
mod continuous_routing;
mod continuous_step_timeout;
mod embed_model;
mod gateway_faults;
mod http_api;
mod http_framing;
mod live_backends;
mod loadgen;
mod long_waits_live;
mod lora_adapters;
mod observability;
mod prefix_cache_live;
mod responses_api;
mod routing;
mod routing_engine;
mod runtime;
mod secrets;
mod sigterm;
mod slow_clients;
mod tools_structured;
mod upstream_exec;
mod upstream_mux;
mod upstream_routing;
mod vllm_compat;
mod vllm_extras;
