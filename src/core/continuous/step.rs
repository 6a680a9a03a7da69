//! What one step is, as plain data: each slot's part in it ([`StepEntry`], [`StepWork`]),
//! how each part ended ([`EntryResult`]), and what a latency model prices ([`StepShape`]).
//!
//! Values only: no scheduler state lives here, and nothing here allocates (a step's shape
//! is added up on the engine's step path).

use crate::core::request::Ticket;

/// What a slot of a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepWork {
    /// Generate one token.
    Decode,
    /// Process `tokens` prompt tokens starting at `offset`; `last` means the prompt is then
    /// complete and the step also samples the first output token.
    Prefill {
        offset: u32,
        tokens: u32,
        last: bool,
    },
}

/// One slot's part in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepEntry {
    pub slot: u32,
    pub ticket: Ticket,
    pub work: StepWork,
    /// Output tokens generated before this step (the index of the token this step samples).
    pub generated: u32,
    /// First time this request runs in this slot (the worker sets up its state).
    pub admitted: bool,
    /// Tokens of this request before this step (prompt prefilled + output generated): the
    /// context its new tokens attend to.
    pub context: u32,
    /// This request's LoRA adapter was loaded into a slot for this step (the step pays
    /// `lora_load_ms` once per such entry).
    pub lora_load: bool,
}

impl StepEntry {
    /// Does this entry sample a token in this step?
    pub fn samples(&self) -> bool {
        matches!(
            self.work,
            StepWork::Decode | StepWork::Prefill { last: true, .. }
        )
    }
}

/// How one entry of a finished step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryResult {
    /// Still going (prefill chunk done, or a token generated and more to come).
    Continue,
    /// The request finished in this step (max_tokens, stop sequence or EOS).
    Finished,
    /// The client went away: free the slot.
    Cancelled,
}

/// What a latency model needs to know of a step: its tokens and the context they attend to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    /// One per generating sequence.
    pub decode_tokens: u32,
    /// Prompt tokens of the prefill chunks.
    pub prefill_tokens: u32,
    /// KV-cache tokens the step reads: per sequence its context plus half its new tokens
    /// (a chunk's later tokens attend to its earlier ones as they are written).
    pub kv_read_tokens: u64,
    /// (query, key) pairs of the step's attention: per sequence with `n` new tokens after
    /// `c` of context, `n c + n (n + 1) / 2` (causal).
    pub attention_pairs: u64,
    /// LoRA adapters loaded for this step (each costs `lora_load_ms`).
    pub lora_loads: u32,
}

impl StepShape {
    /// Adds a sequence with `new` tokens in this step after `context` tokens.
    #[inline]
    pub fn push(&mut self, context: u32, new: u32, decode: bool) {
        if decode {
            self.decode_tokens += new;
        } else {
            self.prefill_tokens += new;
        }
        let (c, n) = (u64::from(context), u64::from(new));
        self.kv_read_tokens += c + n / 2;
        self.attention_pairs += n * c + n * (n + 1) / 2;
    }

    /// The shape of a step with these entries.
    pub fn of<E: std::borrow::Borrow<StepEntry>>(
        entries: impl IntoIterator<Item = E>,
    ) -> StepShape {
        let mut s = StepShape::default();
        for e in entries {
            let e = e.borrow();
            s.lora_loads += u32::from(e.lora_load);
            match e.work {
                StepWork::Decode => s.push(e.context, 1, true),
                StepWork::Prefill { tokens, .. } => s.push(e.context, tokens, false),
            }
        }
        s
    }
}
