//! A workload (arrivals + request shapes + priority mix) and the request sequence it yields.
//!
//! [`Workload::generate`] turns a workload, a request count and a seed into a `Vec` of
//! [`SimRequest`]s, once, before any simulation runs; every strategy then reads that same
//! slice. Arrival times, prompt lengths, output lengths, priorities and prediction noise come
//! from separate RNG streams derived from the seed, so changing one distribution does not
//! move the others. Nothing here may read a clock or depend on anything but its inputs.

use super::arrivals::{secs_to_ns, ArrivalClock, Arrivals};
use super::dist::LengthDist;
use super::prefix::{PrefixArena, PrefixSpan};
use super::priority::PriorityMix;
use super::trace;
use super::SimError;
use crate::core::{Kind, Nanos, Priority, RequestMeta};
use crate::exec::latency::standard_normal;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// Arrivals and request shapes. Keys are documented in `abe simulate --help`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub arrivals: Arrivals,
    /// Prompt length in tokens (ignored by `replay`, which takes lengths from the trace).
    #[serde(default = "default_prompt")]
    pub prompt_tokens: LengthDist,
    /// Output length in tokens; the request asks for exactly this many (`max_tokens`).
    #[serde(default = "default_output")]
    pub output_tokens: LengthDist,
    /// Relative priority weights; absent: all `normal`.
    #[serde(default)]
    pub priority: PriorityMix,
    /// Log-space standard deviation of the output-length prediction the core is given
    /// (`predicted = output x exp(sigma N(0,1))`); 0 gives the oracle (exact) prediction.
    #[serde(default)]
    pub prediction_error_sigma: f64,
}

fn default_prompt() -> LengthDist {
    LengthDist::Fixed { value: 256.0 }
}

fn default_output() -> LengthDist {
    LengthDist::Fixed { value: 128.0 }
}

/// One simulated request: plain data, 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimRequest {
    pub arrival_ns: Nanos,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// What the core is told the output length will be.
    pub predicted_output_tokens: u32,
    pub priority: Priority,
    /// Its prompt's trace-block names in the sequence's [`super::prefix::PrefixArena`]
    /// (empty: no prefix identity; nothing is shared with other requests).
    pub prefix: super::prefix::PrefixSpan,
}

impl SimRequest {
    /// The metadata the core is given: a completion whose prompt is `prompt_tokens x 4`
    /// bytes (the core estimates bytes / 4) asking for `output_tokens`.
    pub fn meta(&self) -> RequestMeta {
        let mut m = RequestMeta::new(
            self.priority,
            Kind::Completion,
            self.prompt_tokens as usize * 4,
            self.output_tokens,
            self.arrival_ns,
        );
        m.predicted_output_tokens = self.predicted_output_tokens;
        m
    }
}

/// Independent RNG streams derived from one seed.
#[derive(Clone, Copy)]
enum Stream {
    Arrivals = 1,
    Prompt = 2,
    Output = 3,
    Priority = 4,
    Prediction = 5,
}

fn stream(seed: u64, s: Stream) -> SmallRng {
    SmallRng::seed_from_u64(seed ^ (s as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A generated request sequence with its prompts' block names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generated {
    pub requests: Vec<SimRequest>,
    /// The block names the requests' `prefix` spans point into (empty unless the workload
    /// replays a trace with `hash_ids`).
    pub arena: PrefixArena,
    /// The trace's block ids, parallel to `arena.chains` (a span indexes both): what
    /// `abe loadgen` derives prompt text from.
    pub trace_ids: Vec<u64>,
}

impl Workload {
    /// The first `requests` requests of this workload for `seed` (fewer for a shorter trace).
    pub fn generate(&self, requests: u64, seed: u64) -> Result<Vec<SimRequest>, SimError> {
        Ok(self.generate_with_prefix(requests, seed)?.requests)
    }

    /// [`Workload::generate`], with the block names of a replayed trace's `hash_ids` (each
    /// request's `prefix` span set, the arena filled); other workloads have none.
    pub fn generate_with_prefix(&self, requests: u64, seed: u64) -> Result<Generated, SimError> {
        let prompt = self.prompt_tokens.sampler("workload.prompt_tokens")?;
        let output = self.output_tokens.sampler("workload.output_tokens")?;
        let priorities = self.priority.cumulative()?;
        let sigma = self.prediction_error_sigma;
        if !(sigma.is_finite() && sigma >= 0.0) {
            return Err(SimError::invalid(
                "workload.prediction_error_sigma",
                format!("{sigma} must be a finite number >= 0"),
            ));
        }
        let mut r_arr = stream(seed, Stream::Arrivals);
        let mut r_prompt = stream(seed, Stream::Prompt);
        let mut r_out = stream(seed, Stream::Output);
        let mut r_pri = stream(seed, Stream::Priority);
        let mut r_pred = stream(seed, Stream::Prediction);
        let mut predict = |out: u32| -> u32 {
            if sigma == 0.0 {
                out
            } else {
                let x = f64::from(out) * (sigma * standard_normal(&mut r_pred)).exp();
                x.round().min(f64::from(u32::MAX)) as u32
            }
        };
        let n = usize::try_from(requests)
            .map_err(|_| SimError::invalid("requests", "too many for this machine"))?;
        if let Arrivals::Replay {
            path,
            format,
            rate_scale,
        } = &self.arrivals
        {
            let k = *rate_scale;
            if !(k.is_finite() && k > 0.0) {
                return Err(SimError::invalid(
                    "workload.arrivals.rate_scale",
                    format!("{k} must be a finite number > 0"),
                ));
            }
            let trace = trace::load(path, *format)?;
            let mut g = Generated::default();
            if trace.has_hash_ids() {
                g.arena = PrefixArena::new(trace.block_tokens);
            }
            for row in trace.rows.iter().take(n) {
                let ids = trace.ids(row);
                let prefix = if ids.is_empty() {
                    PrefixSpan::default()
                } else {
                    g.trace_ids.extend_from_slice(ids);
                    g.arena.push(ids)
                };
                g.requests.push(SimRequest {
                    // x / 1.0 == x exactly: an unscaled trace keeps its arrival times.
                    arrival_ns: secs_to_ns(row.arrival_ms / k / 1e3),
                    prompt_tokens: row.prompt_tokens,
                    output_tokens: row.output_tokens,
                    predicted_output_tokens: predict(row.output_tokens),
                    priority: row
                        .priority
                        .unwrap_or_else(|| PriorityMix::draw(&priorities, &mut r_pri)),
                    prefix,
                });
            }
            return Ok(g);
        }
        let mut clock = self
            .arrivals
            .profile()?
            .map(|(profile, poisson)| ArrivalClock::new(profile, poisson));
        let burst_times = match self.arrivals.bursts()? {
            Some(b) => b.times_ns(n, &mut r_arr),
            None => Vec::new(),
        };
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let arrival_ns = match clock.as_mut() {
                Some(c) => c.next_ns(&mut r_arr),
                // bursty: the merged burst times; saturated: everything at t = 0
                None => burst_times.get(i).copied().unwrap_or(0),
            };
            let output_tokens = output.sample(&mut r_out);
            out.push(SimRequest {
                arrival_ns,
                prompt_tokens: prompt.sample(&mut r_prompt),
                output_tokens,
                predicted_output_tokens: predict(output_tokens),
                priority: PriorityMix::draw(&priorities, &mut r_pri),
                prefix: Default::default(),
            });
        }
        Ok(Generated {
            requests: out,
            ..Generated::default()
        })
    }
}

/// FNV-1a over a request's fields, chained: a fingerprint of a request sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest(u64);

impl Default for Digest {
    fn default() -> Self {
        Digest(0xcbf2_9ce4_8422_2325)
    }
}

impl Digest {
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// Folds one request in. Its prefix span only when it has one, so a sequence without
    /// prefix identity keeps the digest it had before prefixes existed; the span's place in
    /// the arena fingerprints the sequence's block structure, not the ids' values (the same
    /// trace file gives the same ids).
    pub fn push(&mut self, r: &SimRequest) {
        self.bytes(&r.arrival_ns.to_le_bytes());
        self.bytes(&r.prompt_tokens.to_le_bytes());
        self.bytes(&r.output_tokens.to_le_bytes());
        self.bytes(&r.predicted_output_tokens.to_le_bytes());
        self.bytes(&[r.priority.index() as u8]);
        if r.prefix.len > 0 {
            self.bytes(&r.prefix.start.to_le_bytes());
            self.bytes(&r.prefix.len.to_le_bytes());
        }
    }

    /// The digest of a whole sequence.
    pub fn of(requests: &[SimRequest]) -> Digest {
        let mut d = Digest::default();
        for r in requests {
            d.push(r);
        }
        d
    }

    /// 16 lower-case hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poisson(rate: f64) -> Workload {
        Workload {
            arrivals: Arrivals::Poisson { rate_rps: rate },
            prompt_tokens: default_prompt(),
            output_tokens: LengthDist::Uniform {
                min: 10.0,
                max: 20.0,
            },
            priority: PriorityMix::default(),
            prediction_error_sigma: 0.0,
        }
    }

    #[test]
    fn same_seed_same_sequence_other_seed_other_sequence() {
        let w = poisson(100.0);
        let a = w.generate(1000, 7).unwrap();
        let b = w.generate(1000, 7).unwrap();
        let c = w.generate(1000, 8).unwrap();
        assert_eq!(a, b);
        assert_ne!(Digest::of(&a), Digest::of(&c));
        assert!(a.windows(2).all(|p| p[0].arrival_ns <= p[1].arrival_ns));
        assert!(a
            .iter()
            .all(|r| r.predicted_output_tokens == r.output_tokens));
    }

    #[test]
    fn changing_the_length_distribution_keeps_the_arrival_times() {
        let w = poisson(100.0);
        let mut v = w.clone();
        v.output_tokens = LengthDist::Fixed { value: 5.0 };
        let a = w.generate(500, 3).unwrap();
        let b = v.generate(500, 3).unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| x.arrival_ns == y.arrival_ns));
    }

    #[test]
    fn prediction_noise_is_multiplicative_and_seeded() {
        let mut w = poisson(10.0);
        w.prediction_error_sigma = 0.5;
        let a = w.generate(2000, 1).unwrap();
        let off = a
            .iter()
            .filter(|r| r.predicted_output_tokens != r.output_tokens)
            .count();
        assert!(off > 1000, "noise should change most predictions: {off}");
        assert_eq!(a, w.generate(2000, 1).unwrap());
    }
}
