//! Request metadata as the scheduler sees it: priority, kind, token estimate, timing.
//!
//! Plain `Copy` data only. Nothing here owns a payload (prompt text, reply channel): those
//! stay with the driver, keyed by [`Ticket`]. Never add heap-owning fields here, the core's
//! tables are sized once and copied into by value.

use std::fmt;
use std::str::FromStr;

/// Nanoseconds on the driver's clock (live: since runtime start; sim: virtual time).
pub type Nanos = u64;

/// Nanoseconds in one millisecond.
pub const NANOS_PER_MS: u64 = 1_000_000;

/// Converts whole-or-fractional milliseconds to [`Nanos`], saturating at zero.
pub fn ms_to_nanos(ms: f64) -> Nanos {
    if ms <= 0.0 {
        0
    } else {
        (ms * NANOS_PER_MS as f64) as Nanos
    }
}

/// Request priority. Higher priorities are taken first when a batch is formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    Low = 0,
    #[default]
    Normal = 1,
    High = 2,
    Critical = 3,
}

impl Priority {
    /// Number of priority classes.
    pub const COUNT: usize = 4;
    /// Every priority, highest first (the order batches are filled in).
    pub const HIGHEST_FIRST: [Priority; 4] = [
        Priority::Critical,
        Priority::High,
        Priority::Normal,
        Priority::Low,
    ];

    /// Dense index `0..COUNT` (low = 0).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The inverse of [`Priority::index`].
    pub const fn from_index(i: usize) -> Priority {
        match i {
            0 => Priority::Low,
            1 => Priority::Normal,
            2 => Priority::High,
            _ => Priority::Critical,
        }
    }

    /// Lower-case wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority name that is not one of `low|normal|high|critical`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown priority '{0}': expected one of low, normal, high, critical")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "low" => Ok(Priority::Low),
            "normal" => Ok(Priority::Normal),
            "high" => Ok(Priority::High),
            "critical" => Ok(Priority::Critical),
            _ => Err(UnknownPriority(s.to_string())),
        }
    }
}

/// What the request asks the model to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    #[default]
    Completion,
    Embedding,
}

impl Kind {
    /// Lower-case name used in metrics and errors.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Completion => "completion",
            Kind::Embedding => "embedding",
        }
    }
}

/// Upper bounds (inclusive) of the token buckets; the last bucket holds everything larger.
pub const BUCKET_UPPER_TOKENS: [u32; 5] = [128, 512, 1024, 2048, 4096];
/// Number of token buckets (the five bounded ones plus "more").
pub const BUCKET_COUNT: usize = BUCKET_UPPER_TOKENS.len() + 1;
/// Human labels for buckets, used as metric label values.
pub const BUCKET_LABELS: [&str; BUCKET_COUNT] = ["128", "512", "1024", "2048", "4096", "inf"];

/// Number of (priority x bucket) classes: one FIFO and one input ring each.
pub const CLASS_COUNT: usize = Priority::COUNT * BUCKET_COUNT;
// Class sets are u32 bitmasks (the core's non-empty mask, the submitters' ready masks).
const _: () = assert!(CLASS_COUNT <= 32);

/// The token bucket a request with `tokens` estimated tokens falls in (`0..BUCKET_COUNT`).
pub fn bucket_for_tokens(tokens: u32) -> usize {
    let mut i = 0;
    while i < BUCKET_UPPER_TOKENS.len() {
        if tokens <= BUCKET_UPPER_TOKENS[i] {
            return i;
        }
        i += 1;
    }
    BUCKET_COUNT - 1
}

/// Dense class index of a (priority, bucket) pair: `priority * BUCKET_COUNT + bucket`.
pub const fn class_index(priority: Priority, bucket: usize) -> usize {
    priority.index() * BUCKET_COUNT + bucket
}

/// Estimated tokens of a request: prompt bytes / 4 (rounded up) plus `max_tokens`.
pub fn estimate_tokens(prompt_bytes: usize, max_tokens: u32) -> u32 {
    let prompt = prompt_bytes.div_ceil(4);
    u32::try_from(prompt)
        .unwrap_or(u32::MAX)
        .saturating_add(max_tokens)
}

/// Everything the scheduler needs to know about one request. Plain data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestMeta {
    pub priority: Priority,
    pub kind: Kind,
    /// Prompt tokens (estimated: prompt bytes / 4) plus `max_tokens`.
    pub tokens_estimated: u32,
    /// Output tokens asked for (0 for embeddings).
    pub max_tokens: u32,
    /// When the request arrived, on the driver's clock.
    pub arrival_ns: Nanos,
    /// Predicted output length (hint from the client or a predictor); 0 = unknown.
    pub predicted_output_tokens: u32,
    /// The LoRA adapter it runs with ([`super::lora::BASE_MODEL`]: none).
    pub adapter: super::lora::AdapterId,
    /// A chat or a stream: an `upstream` backend sends it as a request of its own even when
    /// it takes prompt arrays ([`super::Alone::OwnRequests`]).
    pub own_request: bool,
}

impl RequestMeta {
    /// A request of `kind` with a prompt of `prompt_bytes` bytes arriving at `arrival_ns`.
    pub fn new(
        priority: Priority,
        kind: Kind,
        prompt_bytes: usize,
        max_tokens: u32,
        arrival_ns: Nanos,
    ) -> Self {
        RequestMeta {
            priority,
            kind,
            tokens_estimated: estimate_tokens(prompt_bytes, max_tokens),
            max_tokens,
            arrival_ns,
            predicted_output_tokens: 0,
            adapter: super::lora::BASE_MODEL,
            own_request: false,
        }
    }

    /// Output tokens to expect: the prediction when there is one, else `max_tokens`.
    pub fn expected_output_tokens(&self) -> u32 {
        if self.predicted_output_tokens > 0 {
            self.predicted_output_tokens
        } else {
            self.max_tokens
        }
    }

    /// Token bucket of this request.
    pub fn bucket(&self) -> usize {
        bucket_for_tokens(self.tokens_estimated)
    }

    /// Class index (priority x bucket) of this request.
    pub fn class(&self) -> usize {
        class_index(self.priority, self.bucket())
    }
}

/// Identifies one admitted request: a slot in the request table plus the slot's generation,
/// so a stale ticket (a slot reused by a later request) is recognised, never confused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub index: u32,
    pub generation: u32,
}

impl Ticket {
    /// Packs the ticket into one integer (for logs and wire ids).
    pub const fn as_u64(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.as_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_spec_bounds() {
        assert_eq!(bucket_for_tokens(0), 0);
        assert_eq!(bucket_for_tokens(128), 0);
        assert_eq!(bucket_for_tokens(129), 1);
        assert_eq!(bucket_for_tokens(512), 1);
        assert_eq!(bucket_for_tokens(1024), 2);
        assert_eq!(bucket_for_tokens(2048), 3);
        assert_eq!(bucket_for_tokens(4096), 4);
        assert_eq!(bucket_for_tokens(4097), 5);
        assert_eq!(bucket_for_tokens(u32::MAX), 5);
    }

    #[test]
    fn token_estimate_is_prompt_bytes_over_four_plus_max_tokens() {
        assert_eq!(estimate_tokens(0, 16), 16);
        assert_eq!(estimate_tokens(400, 100), 200);
        assert_eq!(estimate_tokens(401, 0), 101);
        assert_eq!(estimate_tokens(usize::MAX, u32::MAX), u32::MAX);
    }

    #[test]
    fn priorities_parse_case_insensitively_and_reject_others() {
        assert_eq!("HIGH".parse::<Priority>(), Ok(Priority::High));
        assert_eq!("critical".parse::<Priority>(), Ok(Priority::Critical));
        let err = "urgent".parse::<Priority>().unwrap_err();
        assert!(err.to_string().contains("low, normal, high, critical"));
        for p in Priority::HIGHEST_FIRST {
            assert_eq!(Priority::from_index(p.index()), p);
        }
    }
}
