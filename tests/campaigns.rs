//! The bounded fuzz campaigns and the engine's deterministic simulation (feature
//! `testing`), one binary: request heads, config and API bodies fuzzed, and the real engine
//! under a virtual clock (`dst_engine`); one module per file beside this one. Run one
//! campaign with `cargo test --features testing --test campaigns dst_engine::` (RELIABILITY
//! has the long runs). Why one binary, and what must never be done here: see `live.rs`.

mod common;

mod dst_engine;
mod fuzz_api;
mod fuzz_config;
mod fuzz_http;
