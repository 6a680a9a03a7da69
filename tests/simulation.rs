//! The simulator and the core in virtual time, one binary: `abe simulate` end to end, the
//! continuous scheduler, LoRA and prefix caching in the simulator, trace replay, the research
//! strategies' goals, and the scheduler's deterministic simulation (`dst_core`); one module
//! per file beside this one. Run one file's tests with `cargo test --test simulation
//! simulate_trace::`. Why one binary, and what must never be done here: see `live.rs`.

mod dst_core;
mod research_strategies;
mod simulate;
mod simulate_continuous;
mod simulate_lora;
mod simulate_lora_prefix;
mod simulate_trace;
