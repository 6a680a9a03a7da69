//! Arrival processes: when requests arrive, in virtual time.
//!
//! Every rate-driven process is described by its cumulative rate `Lambda(t)` (expected
//! arrivals by time `t`). The deterministic form puts arrival `i` at `Lambda^-1(i)` (the first
//! at t = 0); the Poisson form puts it at `Lambda^-1(E_1 + ... + E_i)` with unit exponential
//! `E`s, which is an exact non-homogeneous Poisson process (time-rescaling theorem). Trace
//! replay lives in [`super::trace`]. Nothing here reads a clock; randomness comes from the
//! caller's RNG only.

use super::trace::TraceFormat;
use super::SimError;
use crate::core::Nanos;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How requests arrive. Every variant's keys are listed in `abe simulate --help`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "process", rename_all = "snake_case", deny_unknown_fields)]
pub enum Arrivals {
    /// Evenly spaced at `rate_rps` requests per second, the first at t = 0.
    Constant { rate_rps: f64 },
    /// Poisson at `rate_rps` (exponential gaps).
    Poisson { rate_rps: f64 },
    /// Rate rising (or falling) linearly from `start_rps` to `end_rps` over `ramp_s` seconds,
    /// then staying at `end_rps`.
    Ramp {
        start_rps: f64,
        end_rps: f64,
        ramp_s: f64,
        #[serde(default)]
        poisson: bool,
    },
    /// `base_rps`, times `multiplier` during `[spike_start_s, spike_start_s + spike_duration_s)`.
    Spike {
        base_rps: f64,
        multiplier: f64,
        spike_start_s: f64,
        spike_duration_s: f64,
        #[serde(default)]
        poisson: bool,
    },
    /// Every request arrives at t = 0 (a backlog: measures capacity).
    Saturated,
    /// Bursts, as batch clients and agents send them: burst starts are Poisson at
    /// `bursts_per_s`, each burst is `burst_size` requests `gap_ms` apart (the first at the
    /// burst's start). The mean rate is `bursts_per_s x burst_size`; bursts that overlap
    /// interleave.
    Bursty {
        bursts_per_s: f64,
        burst_size: u32,
        #[serde(default)]
        gap_ms: f64,
    },
    /// A closed loop: `clients` clients, each sending its next request `think_ms` after the
    /// answer to its last (uniform within +- `think_jitter` x `think_ms`, default 0.5), the
    /// first requests spread evenly over one think time. This is how a benchmark harness, an
    /// agent or a batch job with a fixed concurrency loads a server; arrival times come from
    /// the run itself, so every strategy gets the same request shapes but its own timing.
    Closed {
        clients: u32,
        think_ms: f64,
        #[serde(default = "half")]
        think_jitter: f64,
    },
    /// Arrivals and shapes from a trace file (abe's rows, an Azure or a Mooncake trace; see
    /// [`super::trace`]); a relative path is resolved against the scenario file's folder.
    /// `rate_scale` plays the trace that many times faster (arrival times divided by it).
    Replay {
        path: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<TraceFormat>,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        rate_scale: f64,
    },
}

fn half() -> f64 {
    0.5
}

fn one() -> f64 {
    1.0
}

fn is_one(v: &f64) -> bool {
    *v == 1.0
}

/// A validated closed loop (see [`Arrivals::Closed`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClosedLoop {
    pub clients: usize,
    pub think_ns: Nanos,
    pub think_jitter: f64,
}

impl ClosedLoop {
    /// One client's think time, from the caller's RNG.
    pub fn think_ns(&self, rng: &mut impl Rng) -> Nanos {
        if self.think_jitter == 0.0 || self.think_ns == 0 {
            return self.think_ns;
        }
        let spread = self.think_jitter * self.think_ns as f64;
        let t = self.think_ns as f64 + rng.gen_range(-spread..=spread);
        t.max(0.0).round() as Nanos
    }

    /// When client `i`'s first request arrives: evenly over one think time.
    pub fn first_arrival_ns(&self, i: usize) -> Nanos {
        self.think_ns * i as u64 / self.clients as u64
    }
}

/// A validated rate profile: the cumulative rate and its inverse, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RateProfile {
    Constant {
        rate: f64,
    },
    Ramp {
        r0: f64,
        r1: f64,
        ramp_s: f64,
    },
    Spike {
        base: f64,
        mult: f64,
        start_s: f64,
        duration_s: f64,
    },
}

fn positive(what: &str, v: f64) -> Result<f64, SimError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(SimError::invalid(
            format!("workload.arrivals.{what}"),
            format!("{v} must be a finite number > 0"),
        ))
    }
}

fn non_negative(what: &str, v: f64) -> Result<f64, SimError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(SimError::invalid(
            format!("workload.arrivals.{what}"),
            format!("{v} must be a finite number >= 0"),
        ))
    }
}

impl Arrivals {
    /// The rate profile and whether arrivals are Poisson; `None` for `saturated` and `replay`.
    pub fn profile(&self) -> Result<Option<(RateProfile, bool)>, SimError> {
        Ok(Some(match *self {
            Arrivals::Constant { rate_rps } => (
                RateProfile::Constant {
                    rate: positive("rate_rps", rate_rps)?,
                },
                false,
            ),
            Arrivals::Poisson { rate_rps } => (
                RateProfile::Constant {
                    rate: positive("rate_rps", rate_rps)?,
                },
                true,
            ),
            Arrivals::Ramp {
                start_rps,
                end_rps,
                ramp_s,
                poisson,
            } => (
                RateProfile::Ramp {
                    r0: non_negative("start_rps", start_rps)?,
                    r1: positive("end_rps", end_rps)?,
                    ramp_s: non_negative("ramp_s", ramp_s)?,
                },
                poisson,
            ),
            Arrivals::Spike {
                base_rps,
                multiplier,
                spike_start_s,
                spike_duration_s,
                poisson,
            } => (
                RateProfile::Spike {
                    base: positive("base_rps", base_rps)?,
                    mult: positive("multiplier", multiplier)?,
                    start_s: non_negative("spike_start_s", spike_start_s)?,
                    duration_s: non_negative("spike_duration_s", spike_duration_s)?,
                },
                poisson,
            ),
            Arrivals::Saturated
            | Arrivals::Replay { .. }
            | Arrivals::Closed { .. }
            | Arrivals::Bursty { .. } => return Ok(None),
        }))
    }

    /// The closed loop, validated, for `closed`; `None` for every open process.
    pub fn closed_loop(&self) -> Result<Option<ClosedLoop>, SimError> {
        let Arrivals::Closed {
            clients,
            think_ms,
            think_jitter,
        } = *self
        else {
            return Ok(None);
        };
        if clients == 0 {
            return Err(SimError::invalid(
                "workload.arrivals.clients",
                "0 must be at least 1",
            ));
        }
        if !(0.0..=1.0).contains(&think_jitter) {
            return Err(SimError::invalid(
                "workload.arrivals.think_jitter",
                format!("{think_jitter} must be between 0 and 1"),
            ));
        }
        Ok(Some(ClosedLoop {
            clients: clients as usize,
            think_ns: secs_to_ns(non_negative("think_ms", think_ms)? / 1e3),
            think_jitter,
        }))
    }

    /// True for `saturated`.
    pub fn is_saturated(&self) -> bool {
        matches!(self, Arrivals::Saturated)
    }

    /// The bursts, validated, for `bursty`; `None` for every other process.
    pub fn bursts(&self) -> Result<Option<Bursts>, SimError> {
        let Arrivals::Bursty {
            bursts_per_s,
            burst_size,
            gap_ms,
        } = *self
        else {
            return Ok(None);
        };
        if burst_size == 0 {
            return Err(SimError::invalid(
                "workload.arrivals.burst_size",
                "0 must be at least 1",
            ));
        }
        Ok(Some(Bursts {
            bursts_per_s: positive("bursts_per_s", bursts_per_s)?,
            burst_size,
            gap_s: non_negative("gap_ms", gap_ms)? / 1e3,
        }))
    }

    /// This process with every arrival rate multiplied by `k` (the `rate_scale` sweep key):
    /// rates of `constant`, `poisson`, `ramp` and `spike`, burst starts of `bursty`, and a
    /// `replay` trace's time axis (timestamps divided by `k`). `saturated` and `closed` have
    /// no rate to scale (sweep `clients` for a closed loop).
    pub fn scaled(&self, k: f64) -> Result<Arrivals, SimError> {
        let k = positive("rate_scale", k)?;
        let mut a = self.clone();
        match &mut a {
            Arrivals::Constant { rate_rps } | Arrivals::Poisson { rate_rps } => *rate_rps *= k,
            Arrivals::Ramp {
                start_rps, end_rps, ..
            } => {
                *start_rps *= k;
                *end_rps *= k;
            }
            Arrivals::Spike { base_rps, .. } => *base_rps *= k,
            Arrivals::Bursty { bursts_per_s, .. } => *bursts_per_s *= k,
            // A trace's time axis compressed k times: every rate in it times k.
            Arrivals::Replay { rate_scale, .. } => *rate_scale *= k,
            Arrivals::Saturated | Arrivals::Closed { .. } => {
                return Err(SimError::invalid(
                    "--sweep",
                    "rate_scale needs a rate: `saturated` and `closed` arrivals have none \
                     (sweep clients for a closed loop)",
                ))
            }
        }
        Ok(a)
    }

    /// This closed loop with `clients` clients (the `clients` sweep key).
    pub fn with_clients(&self, n: u32) -> Result<Arrivals, SimError> {
        let mut a = self.clone();
        match &mut a {
            Arrivals::Closed { clients, .. } => *clients = n,
            _ => {
                return Err(SimError::invalid(
                    "--sweep",
                    "clients needs `process = \"closed\"` arrivals (sweep rate_scale for an \
                     open workload)",
                ))
            }
        }
        Ok(a)
    }
}

/// A validated bursty process (see [`Arrivals::Bursty`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bursts {
    pub bursts_per_s: f64,
    pub burst_size: u32,
    pub gap_s: f64,
}

impl Bursts {
    /// The first `n` arrival times in ns, sorted, from the caller's RNG: enough bursts for `n`
    /// requests, their members merged in time order.
    pub fn times_ns(&self, n: usize, rng: &mut impl Rng) -> Vec<Nanos> {
        let size = self.burst_size as usize;
        let mut out = Vec::with_capacity(n.div_ceil(size) * size);
        let mut start_s = 0.0;
        while out.len() < n {
            for j in 0..size {
                out.push(secs_to_ns(start_s + j as f64 * self.gap_s));
            }
            let u: f64 = rng.gen();
            start_s += -(1.0 - u).ln() / self.bursts_per_s;
        }
        out.sort_unstable();
        out.truncate(n);
        out
    }
}

impl RateProfile {
    /// Expected arrivals in `[0, t_s]`.
    pub fn cumulative(&self, t_s: f64) -> f64 {
        match *self {
            RateProfile::Constant { rate } => rate * t_s,
            RateProfile::Ramp { r0, r1, ramp_s } => {
                if t_s <= ramp_s {
                    let k = if ramp_s > 0.0 {
                        (r1 - r0) / ramp_s
                    } else {
                        0.0
                    };
                    r0 * t_s + 0.5 * k * t_s * t_s
                } else {
                    0.5 * (r0 + r1) * ramp_s + r1 * (t_s - ramp_s)
                }
            }
            RateProfile::Spike {
                base,
                mult,
                start_s,
                duration_s,
            } => {
                let before = t_s.min(start_s);
                let during = (t_s - start_s).clamp(0.0, duration_s);
                let after = (t_s - start_s - duration_s).max(0.0);
                base * (before + mult * during + after)
            }
        }
    }

    /// The time in seconds by which `x` arrivals are expected (inverse of `cumulative`).
    pub fn inverse(&self, x: f64) -> f64 {
        if x <= 0.0 {
            return 0.0;
        }
        match *self {
            RateProfile::Constant { rate } => x / rate,
            RateProfile::Ramp { r0, r1, ramp_s } => {
                let at_end = 0.5 * (r0 + r1) * ramp_s;
                if x <= at_end && ramp_s > 0.0 {
                    // Root of (k/2) t^2 + r0 t - x = 0 in the cancellation-free form
                    // t = 2x / (r0 + sqrt(r0^2 + 2kx)); valid for k of either sign.
                    let k = (r1 - r0) / ramp_s;
                    let disc = (r0 * r0 + 2.0 * k * x).max(0.0);
                    (2.0 * x / (r0 + disc.sqrt())).min(ramp_s)
                } else {
                    ramp_s + (x - at_end) / r1
                }
            }
            RateProfile::Spike {
                base,
                mult,
                start_s,
                duration_s,
            } => {
                let before = base * start_s;
                let during = base * mult * duration_s;
                if x <= before {
                    x / base
                } else if x <= before + during {
                    start_s + (x - before) / (base * mult)
                } else {
                    start_s + duration_s + (x - before - during) / base
                }
            }
        }
    }
}

/// Converts seconds to whole nanoseconds (saturating; negative is 0).
pub fn secs_to_ns(t_s: f64) -> u64 {
    if t_s <= 0.0 {
        0
    } else {
        (t_s * 1e9).round().min(u64::MAX as f64) as u64
    }
}

/// Generates arrival times one by one from a rate profile.
#[derive(Clone, Debug)]
pub struct ArrivalClock {
    profile: RateProfile,
    poisson: bool,
    /// Cumulative-rate position of the next arrival (`i` or a running sum of exponentials).
    position: f64,
    issued: u64,
}

impl ArrivalClock {
    /// A clock at t = 0.
    pub fn new(profile: RateProfile, poisson: bool) -> Self {
        ArrivalClock {
            profile,
            poisson,
            position: 0.0,
            issued: 0,
        }
    }

    /// The next arrival time in ns (non-decreasing).
    pub fn next_ns(&mut self, rng: &mut impl Rng) -> u64 {
        if self.poisson {
            let u: f64 = rng.gen();
            self.position += -(1.0 - u).ln();
        } else {
            self.position = self.issued as f64;
        }
        self.issued += 1;
        secs_to_ns(self.profile.inverse(self.position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn inverse_undoes_cumulative_for_every_profile() {
        let profiles = [
            RateProfile::Constant { rate: 100.0 },
            RateProfile::Ramp {
                r0: 10.0,
                r1: 500.0,
                ramp_s: 60.0,
            },
            RateProfile::Ramp {
                r0: 500.0,
                r1: 10.0,
                ramp_s: 60.0,
            },
            RateProfile::Ramp {
                r0: 0.0,
                r1: 50.0,
                ramp_s: 10.0,
            },
            RateProfile::Spike {
                base: 100.0,
                mult: 10.0,
                start_s: 30.0,
                duration_s: 10.0,
            },
        ];
        for p in profiles {
            for t in [
                0.0, 0.5, 7.0, 29.9, 30.0, 35.0, 40.0, 59.0, 60.0, 61.0, 300.0,
            ] {
                let back = p.inverse(p.cumulative(t));
                assert!((back - t).abs() < 1e-6, "{p:?} at {t}: {back}");
            }
        }
    }

    #[test]
    fn ramp_expected_count_is_the_area_under_the_rate() {
        let p = RateProfile::Ramp {
            r0: 10.0,
            r1: 500.0,
            ramp_s: 60.0,
        };
        assert!((p.cumulative(60.0) - 15_300.0).abs() < 1e-6);
        assert!((p.cumulative(70.0) - 20_300.0).abs() < 1e-6);
    }

    #[test]
    fn zero_or_negative_rates_are_refused_with_the_key() {
        let e = Arrivals::Constant { rate_rps: 0.0 }.profile().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid workload.arrivals.rate_rps: 0 must be a finite number > 0"
        );
        assert!(Arrivals::Saturated.profile().unwrap().is_none());
    }

    #[test]
    fn bursts_come_in_groups_at_the_asked_mean_rate() {
        let b = Arrivals::Bursty {
            bursts_per_s: 2.0,
            burst_size: 8,
            gap_ms: 1.0,
        }
        .bursts()
        .unwrap()
        .unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let t = b.times_ns(8_000, &mut rng);
        assert_eq!(t.len(), 8_000);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        let span_s = *t.last().unwrap() as f64 / 1e9;
        let rate = 8_000.0 / span_s;
        assert!((rate - 16.0).abs() < 1.0, "{rate}");
        // Most gaps are the intra-burst gap.
        let short = t.windows(2).filter(|w| w[1] - w[0] <= 1_000_000).count();
        assert!(short > 6_500, "{short}");
    }

    #[test]
    fn scaling_multiplies_every_rate_and_refuses_what_has_none() {
        let a = Arrivals::Spike {
            base_rps: 10.0,
            multiplier: 3.0,
            spike_start_s: 1.0,
            spike_duration_s: 1.0,
            poisson: true,
        };
        let Arrivals::Spike {
            base_rps,
            multiplier,
            ..
        } = a.scaled(0.5).unwrap()
        else {
            panic!()
        };
        assert_eq!((base_rps, multiplier), (5.0, 3.0));
        assert!(Arrivals::Saturated.scaled(2.0).is_err());
        assert!(Arrivals::Poisson { rate_rps: 1.0 }.scaled(0.0).is_err());
        assert!(Arrivals::Poisson { rate_rps: 1.0 }.with_clients(4).is_err());
    }
}
