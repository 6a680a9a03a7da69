//! The `sim` executor: sleeps for a latency model's service time and answers with
//! deterministic synthetic output. Fault injection (error rate, added latency, hang) is read
//! per batch from shared atomics, so tests and chaos runs can change it while it runs.

use super::latency::LatencyModel;
use super::{prompt_tokens, synth, BatchItem, ExecError, Executor, FinishReason, Output, StepItem};
use crate::core::continuous::{EntryResult, StepShape};
use crate::core::Kind;
use crate::sync::AtomicBool;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
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

/// What text the sim executor answers with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextMode {
    /// Words from a seeded vocabulary, deterministic in the prompt and sampling settings.
    #[default]
    Synthetic,
    /// The prompt's own words, in order (as the llm-d inference simulator's echo mode): the
    /// answer ends by itself ("stop") when the prompt is used up, unless `ignore_eos` or
    /// `min_tokens` ask for more, which repeat it.
    Echo,
}

/// The `i`-th output word (0-based) in echo mode: the prompt's words, repeated.
fn echo_word(prompt: &str, i: u32) -> &str {
    let words = prompt.split_whitespace().count().max(1);
    prompt
        .split_whitespace()
        .nth(i as usize % words)
        .unwrap_or("")
}

/// Settings of one sim executor.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub latency: LatencyModel,
    /// Embedding size when the client does not ask for one.
    pub embedding_dimensions: u32,
    /// RNG seed (latency noise and fault draws).
    pub seed: u64,
    /// Continuous batching: mean of the exponential distribution a request's natural
    /// length (where it stops by itself, finish_reason "stop") is drawn from, capped by
    /// max_tokens; 0: every request runs to max_tokens.
    pub natural_length_mean_tokens: u32,
    /// Synthetic words or the prompt echoed.
    pub text: TextMode,
    /// What loading a LoRA adapter into a slot adds to the step or batch that loads it.
    pub lora_load_ms: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: LatencyModel::LINEAR_DEFAULT,
            embedding_dimensions: 384,
            seed: 1,
            natural_length_mean_tokens: 0,
            text: TextMode::Synthetic,
            lora_load_ms: 0.0,
        }
    }
}

/// A request occupying a slot in continuous batching.
struct SlotRequest {
    /// Embedding requests: their dimensions (they end after prefill, without a token).
    embedding_dims: Option<u32>,
    /// Stream key of the request (prompt + seed).
    key: u64,
    /// Draws the words of the output, one per token.
    words: SmallRng,
    prompt_tokens: u32,
    max_tokens: u32,
    /// Where the request stops by itself (EOS).
    natural_tokens: u32,
    generated: u32,
    text: String,
    stop: Option<Arc<[String]>>,
    /// Streaming requests get their text as token events.
    stream: bool,
    /// Echo mode: the prompt whose words the output repeats.
    echo: Option<Arc<str>>,
    /// Bytes of `text` already handed out as token events (text after it was held back,
    /// e.g. a possible start of a stop sequence, and goes out with the next token).
    unsent_from: usize,
}

/// The simulated model replica.
pub struct SimExecutor {
    cfg: SimConfig,
    faults: Arc<Faults>,
    stop: Arc<AtomicBool>,
    rng: SmallRng,
    /// Continuous batching: per-slot request state (the "KV cache").
    slots: Vec<Option<SlotRequest>>,
    /// Shapes of the batch being priced, sorted by the latency model.
    sort_scratch: Vec<(u32, u32)>,
    /// This thread's timer slack was tightened (see [`tighten_timer_slack`]).
    timer_slack_set: bool,
}

/// Linux adds a thread's timer slack (50 us by default) to every sleep, so each simulated
/// step and batch ran up to 50 us long; a continuous-mode decode step is ~6 ms, so that is
/// up to ~1 % per step, and TTFT pays it more than once. Measured with
/// `MODE=continuous LATENCY_MODEL=roofline WORKERS=2 tools/sim_vs_live.sh` (2 vCPU, shared):
/// live / simulated p50 TTFT 1.048 and 1.055 at 50 us (load ~5), 1.031 (load ~5), 1.013 and
/// 1.021 (load 2-5) at 1 us; p50 TPOT 1.031-1.032 -> 1.011-1.021. Costs only coalescing: a
/// few more timer wake-ups.
#[cfg(target_os = "linux")]
fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument (the slack in ns) and changes
    // only the calling thread's timer slack; no memory is passed to the kernel.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong) };
}

#[cfg(not(target_os = "linux"))]
fn tighten_timer_slack() {}

impl SimExecutor {
    /// An executor reading faults from `faults`; `stop` cuts sleeps short at shutdown.
    pub fn new(cfg: SimConfig, faults: Arc<Faults>, stop: Arc<AtomicBool>) -> Self {
        let rng = SmallRng::seed_from_u64(cfg.seed);
        SimExecutor {
            cfg,
            faults,
            stop,
            rng,
            slots: Vec::new(),
            sort_scratch: Vec::new(),
            timer_slack_set: false,
        }
    }

    /// Sleeps until `ms` after `from`, in slices, returning early when `stop` is set (at
    /// once if that time has passed).
    fn sleep_ms(&mut self, from: Instant, ms: f64) {
        if ms <= 0.0 {
            return;
        }
        if !self.timer_slack_set {
            // Once, on the thread that sleeps (the worker's, not the one that built us).
            tighten_timer_slack();
            self.timer_slack_set = true;
        }
        let until = from + Duration::from_secs_f64(ms / 1000.0);
        loop {
            let now = Instant::now();
            if now >= until || self.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }

    /// Spends `service_ms` plus the injected latency and hang from `from`, then draws the
    /// injected error: what every batch and every step goes through.
    fn serve(&mut self, from: Instant, service_ms: f64) -> Result<(), ExecError> {
        let faults = self.faults.get();
        let mut ms = service_ms + faults.added_latency_ms;
        if faults.hang_rate > 0.0 && self.rng.gen_bool(faults.hang_rate.clamp(0.0, 1.0)) {
            ms += faults.hang_ms;
        }
        self.sleep_ms(from, ms);
        if faults.error_rate > 0.0 && self.rng.gen_bool(faults.error_rate.clamp(0.0, 1.0)) {
            return Err(ExecError::Injected("error_rate"));
        }
        Ok(())
    }

    /// Dimensions of an embedding: as asked, or the configured default.
    fn embedding_dims(&self, work: &super::Work) -> u32 {
        if work.dimensions > 0 {
            work.dimensions
        } else {
            self.cfg.embedding_dimensions
        }
    }
}

/// Echo mode, a whole answer of at most `max_tokens` words: the prompt's words (repeated
/// past its end only when `ignore_eos` or `min_tokens` ask for more), and why it ended.
fn echo_text(work: &super::Work, max_tokens: u32) -> (String, FinishReason, u32) {
    let words = work.prompt.split_whitespace().count().max(1) as u32;
    let wanted = if work.sampling.ignore_eos {
        max_tokens
    } else {
        words.max(work.sampling.min_tokens).min(max_tokens)
    };
    let mut text = String::new();
    for i in 0..wanted {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(echo_word(&work.prompt, i));
    }
    let reason = if wanted < max_tokens {
        FinishReason::Stop
    } else {
        FinishReason::Length
    };
    (text, reason, wanted)
}

impl SimExecutor {
    /// Slot state for a request admitted in this step; deterministic in the prompt, seed
    /// and sampling settings, so a preempted request regenerates the same tokens.
    fn slot_request(&self, work: &super::Work) -> SlotRequest {
        let key = work.stream_key();
        let mut natural_rng = SmallRng::seed_from_u64(key ^ 0x6e61_7475_7261_6c00);
        let echo_words = work.prompt.split_whitespace().count().max(1) as u32;
        let natural_tokens = match self.cfg.natural_length_mean_tokens {
            _ if work.sampling.ignore_eos => work.max_tokens,
            _ if self.cfg.text == TextMode::Echo => echo_words,
            0 => work.max_tokens,
            mean => {
                let u: f64 = natural_rng.gen_range(f64::MIN_POSITIVE..1.0);
                ((-f64::from(mean) * u.ln()).round() as u32).max(1)
            }
        }
        .max(work.sampling.min_tokens);
        let embedding_dims = (work.kind == Kind::Embedding).then(|| self.embedding_dims(work));
        SlotRequest {
            embedding_dims,
            key,
            words: SmallRng::seed_from_u64(key),
            prompt_tokens: prompt_tokens(&work.prompt),
            max_tokens: work.max_tokens.max(1),
            natural_tokens: natural_tokens.min(work.max_tokens.max(1)),
            generated: 0,
            text: String::new(),
            stop: work.sampling.stop.clone(),
            stream: work.stream,
            echo: (self.cfg.text == TextMode::Echo).then(|| work.prompt.clone()),
            unsent_from: 0,
        }
    }
}

impl Executor for SimExecutor {
    fn step(&mut self, items: &mut [StepItem], dispatched: Instant) -> Result<(), ExecError> {
        let shape = StepShape::of(items.iter().map(|i| &i.entry));
        let lora_ms = f64::from(shape.lora_loads) * self.cfg.lora_load_ms;
        // From the engine turn that formed the step, as the simulator times it: the
        // worker's wake-up is inside the step, not on top of it.
        self.serve(dispatched, self.cfg.latency.step_ms(&shape) + lora_ms)?;
        for item in items.iter_mut() {
            let slot = item.entry.slot as usize;
            if slot >= self.slots.len() {
                self.slots.resize_with(slot + 1, || None);
            }
            if item.entry.admitted {
                let Some(work) = item.work.as_ref() else {
                    return Err(ExecError::Backend(format!(
                        "slot {slot} admitted without its request"
                    )));
                };
                self.slots[slot] = Some(self.slot_request(work));
            }
            item.token = None;
            item.output = None;
            item.result = EntryResult::Continue;
            if !item.entry.samples() {
                continue;
            }
            let Some(state) = self.slots[slot].as_mut() else {
                return Err(ExecError::Backend(format!("slot {slot} has no request")));
            };
            if let Some(dims) = state.embedding_dims {
                // An embedding is done once its input is processed.
                let state = self.slots[slot].take().expect("checked above");
                item.result = EntryResult::Finished;
                item.output = Some(Output::Embedding {
                    vector: synth::embedding(state.key, dims as usize),
                    prompt_tokens: state.prompt_tokens,
                });
                continue;
            }
            let word = match &state.echo {
                Some(prompt) => echo_word(prompt, state.generated),
                None => synth::word(&mut state.words),
            };
            let checked_len = state.text.len();
            if state.generated > 0 {
                state.text.push(' ');
            }
            state.text.push_str(word);
            state.generated += 1;
            let stops = state.stop.as_deref();
            let stop_cut = super::stop_at_since(&state.text, checked_len, stops);
            if state.stream
                && stop_cut.is_none()
                && !super::may_continue_into_stop(&state.text, stops)
            {
                item.token_offset = state.unsent_from as u32;
                item.token = Some(state.text[state.unsent_from..].to_string());
                state.unsent_from = state.text.len();
            }
            let finish_reason = if stop_cut.is_some() {
                FinishReason::Stop
            } else if state.generated >= state.max_tokens {
                FinishReason::Length
            } else if state.generated >= state.natural_tokens {
                FinishReason::Stop
            } else {
                continue;
            };
            let mut state = self.slots[slot].take().expect("checked above");
            if let Some(cut) = stop_cut {
                state.text.truncate(cut);
            }
            item.result = EntryResult::Finished;
            item.output = Some(Output::Text {
                text: state.text,
                prompt_tokens: state.prompt_tokens,
                completion_tokens: state.generated,
                finish_reason,
                tool_calls: None,
                cached_tokens: None,
            });
        }
        Ok(())
    }

    fn execute(
        &mut self,
        items: &mut [BatchItem],
        _tokens: &mut dyn crate::exec::TokenSink,
    ) -> Result<(), ExecError> {
        let mut shapes: smallvec::SmallVec<[(u32, u32); 64]> = smallvec::SmallVec::new();
        for item in items.iter() {
            let p = prompt_tokens(&item.work.prompt);
            let o = match item.work.kind {
                Kind::Completion => item.work.max_tokens,
                Kind::Embedding => 0,
            };
            shapes.push((p, o));
        }
        let service_ms = self
            .cfg
            .latency
            .batch_ms(&shapes, &mut self.sort_scratch, &mut self.rng);
        let loads: u32 = items.iter().map(|i| i.lora_loads).sum();
        self.serve(
            Instant::now(),
            service_ms + f64::from(loads) * self.cfg.lora_load_ms,
        )?;
        for (item, &(p, o)) in items.iter_mut().zip(shapes.iter()) {
            let key = item.work.stream_key();
            item.output = Some(match item.work.kind {
                Kind::Completion => {
                    let (mut text, mut finish_reason, mut tokens) = match self.cfg.text {
                        TextMode::Synthetic => (synth::text(key, o), FinishReason::Length, o),
                        TextMode::Echo => echo_text(&item.work, o),
                    };
                    if let Some(cut) = super::stop_at(&text, item.work.stop()) {
                        // Tokens up to and including the one the stop sequence starts in.
                        tokens = (text[..cut].matches(' ').count() as u32 + 1).min(o);
                        text.truncate(cut);
                        finish_reason = FinishReason::Stop;
                    }
                    Output::Text {
                        text,
                        prompt_tokens: p,
                        completion_tokens: tokens,
                        finish_reason,
                        tool_calls: None,
                        cached_tokens: None,
                    }
                }
                Kind::Embedding => Output::Embedding {
                    vector: synth::embedding(key, self.embedding_dims(&item.work) as usize),
                    prompt_tokens: p,
                },
            });
        }
        Ok(())
    }
}
