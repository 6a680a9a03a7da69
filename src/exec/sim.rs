//! The `sim` executor: sleeps for a latency model's service time and answers with
//! deterministic synthetic output. Fault injection (error rate, added latency, hang) is read
//! per batch from shared atomics, so tests and chaos runs can change it while it runs.

use super::latency::LatencyModel;
use super::{prompt_tokens, synth, BatchItem, ExecError, Executor, FinishReason, Output};
use crate::core::Kind;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Faults to inject, changeable at run time. Probabilities and durations are stored as f64
/// bits in atomics; Relaxed is enough: a fault setting is advisory and read once per batch.
#[derive(Debug, Default)]
pub struct Faults {
    error_rate: AtomicU64,
    added_latency_ms: AtomicU64,
    hang_rate: AtomicU64,
    hang_ms: AtomicU64,
}

/// A plain copy of [`Faults`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultSettings {
    /// Probability that a batch fails.
    pub error_rate: f64,
    /// Extra latency added to every batch, in ms.
    pub added_latency_ms: f64,
    /// Probability that a batch hangs for `hang_ms` before answering.
    pub hang_rate: f64,
    /// How long a hang lasts, in ms.
    pub hang_ms: f64,
}

impl Faults {
    /// Shared fault cell with `settings`.
    pub fn new(settings: FaultSettings) -> Arc<Faults> {
        let f = Arc::new(Faults::default());
        f.set(settings);
        f
    }

    /// Replaces the settings.
    pub fn set(&self, s: FaultSettings) {
        self.error_rate
            .store(s.error_rate.to_bits(), Ordering::Relaxed);
        self.added_latency_ms
            .store(s.added_latency_ms.to_bits(), Ordering::Relaxed);
        self.hang_rate
            .store(s.hang_rate.to_bits(), Ordering::Relaxed);
        self.hang_ms.store(s.hang_ms.to_bits(), Ordering::Relaxed);
    }

    /// Current settings.
    pub fn get(&self) -> FaultSettings {
        FaultSettings {
            error_rate: f64::from_bits(self.error_rate.load(Ordering::Relaxed)),
            added_latency_ms: f64::from_bits(self.added_latency_ms.load(Ordering::Relaxed)),
            hang_rate: f64::from_bits(self.hang_rate.load(Ordering::Relaxed)),
            hang_ms: f64::from_bits(self.hang_ms.load(Ordering::Relaxed)),
        }
    }
}

/// Settings of one sim executor.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub latency: LatencyModel,
    /// Embedding size when the client does not ask for one.
    pub embedding_dimensions: u32,
    /// RNG seed (latency noise and fault draws).
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: LatencyModel::LINEAR_DEFAULT,
            embedding_dimensions: 384,
            seed: 1,
        }
    }
}

/// The simulated model replica.
pub struct SimExecutor {
    cfg: SimConfig,
    faults: Arc<Faults>,
    stop: Arc<AtomicBool>,
    rng: SmallRng,
}

impl SimExecutor {
    /// An executor reading faults from `faults`; `stop` cuts sleeps short at shutdown.
    pub fn new(cfg: SimConfig, faults: Arc<Faults>, stop: Arc<AtomicBool>) -> Self {
        let rng = SmallRng::seed_from_u64(cfg.seed);
        SimExecutor {
            cfg,
            faults,
            stop,
            rng,
        }
    }

    /// Sleeps `ms`, in slices, returning early when `stop` is set.
    fn sleep_ms(&self, ms: f64) {
        if ms <= 0.0 {
            return;
        }
        let until = Instant::now() + Duration::from_secs_f64(ms / 1000.0);
        loop {
            let now = Instant::now();
            if now >= until || self.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }
}

impl Executor for SimExecutor {
    fn execute(&mut self, items: &mut [BatchItem]) -> Result<(), ExecError> {
        let faults = self.faults.get();
        let mut shapes: smallvec::SmallVec<[(u32, u32); 64]> = smallvec::SmallVec::new();
        for item in items.iter() {
            let p = prompt_tokens(&item.work.prompt);
            let o = match item.work.kind {
                Kind::Completion => item.work.max_tokens,
                Kind::Embedding => 0,
            };
            shapes.push((p, o));
        }
        let mut ms = self.cfg.latency.batch_ms(&shapes, &mut self.rng) + faults.added_latency_ms;
        if faults.hang_rate > 0.0 && self.rng.gen_bool(faults.hang_rate.clamp(0.0, 1.0)) {
            ms += faults.hang_ms;
        }
        self.sleep_ms(ms);
        if faults.error_rate > 0.0 && self.rng.gen_bool(faults.error_rate.clamp(0.0, 1.0)) {
            return Err(ExecError::Injected("error_rate"));
        }
        for (item, &(p, o)) in items.iter_mut().zip(shapes.iter()) {
            let key = synth::stream_key(&item.work.prompt, item.work.seed);
            item.output = Some(match item.work.kind {
                Kind::Completion => Output::Text {
                    text: synth::text(key, o),
                    prompt_tokens: p,
                    completion_tokens: o,
                    finish_reason: FinishReason::Length,
                },
                Kind::Embedding => {
                    let dims = if item.work.dimensions > 0 {
                        item.work.dimensions
                    } else {
                        self.cfg.embedding_dimensions
                    };
                    Output::Embedding {
                        vector: synth::embedding(key, dims as usize),
                        prompt_tokens: p,
                    }
                }
            });
        }
        Ok(())
    }
}
