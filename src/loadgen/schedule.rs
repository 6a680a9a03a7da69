//! The send schedule: the simulator's request sequence for (scenario, seed, count), with each
//! request's send time relative to the start of the run.
//!
//! The sequence comes from [`Workload::generate`], the same call `abe simulate` makes, so
//! the same scenario, seed and count give the same requests (the [`Digest`] proves it; a
//! prefix of a sequence is the sequence of the shorter count, which is what `--duration`
//! relies on). `rate_scale` is applied exactly as `abe simulate --rate-scale` applies it
//! ([`Arrivals::scaled`](crate::sim::arrivals::Arrivals::scaled): every rate times `k`, a replayed trace's timestamps divided by
//! `k`) before the sequence is generated, so a scaled run replays the simulator's scaled
//! sequence, digest included. (Dividing the unscaled send times by `k` instead, as this
//! module once did, gave another digest, rounding apart for traces, and another schedule
//! for ramps and spikes, whose durations `scaled` keeps.) Nothing here reads a clock.

use super::error::LoadgenError;
use crate::sim::scenario::Scenario;
use crate::sim::workload::{Digest, SimRequest, Workload};

/// Requests to send and when.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The generated requests, a prefix of the simulator's sequence for the same rate scale.
    pub requests: Vec<SimRequest>,
    /// `send_at_ns[i]`: when request `i` is due, ns after the start; non-decreasing.
    pub send_at_ns: Vec<u64>,
    /// Fingerprint of `requests` (the simulator's `request_digest` for this count).
    pub digest: Digest,
    /// A replayed trace's block ids, which the requests' `prefix` spans index (empty: none).
    pub trace_ids: Vec<u64>,
}

impl Schedule {
    /// The schedule for `scenario` with `seed`: `requests` requests (default: the
    /// scenario's), every arrival rate times `rate_scale` (as `abe simulate --rate-scale`),
    /// cut at `duration_s` if given.
    pub fn new(
        scenario: &Scenario,
        seed: u64,
        requests: Option<u64>,
        duration_s: Option<f64>,
        rate_scale: f64,
    ) -> Result<Schedule, LoadgenError> {
        if !(rate_scale.is_finite() && rate_scale > 0.0) {
            return Err(LoadgenError::invalid(
                "--rate-scale",
                format!("{rate_scale} must be a finite number > 0"),
            ));
        }
        if let Some(d) = duration_s {
            if !(d.is_finite() && d > 0.0) {
                return Err(LoadgenError::invalid(
                    "--duration",
                    format!("{d} must be a finite number of seconds > 0"),
                ));
            }
        }
        let count = requests.unwrap_or(scenario.requests);
        // Same bound as `abe simulate`, so every loadgen count is also a simulator count.
        if count == 0 || count >= u64::from(u32::MAX) {
            return Err(LoadgenError::invalid(
                "--requests",
                format!("{count} must be in 1..{}", u32::MAX),
            ));
        }
        let scaled;
        let workload = if rate_scale == 1.0 {
            &scenario.workload
        } else {
            let arrivals = scenario
                .workload
                .arrivals
                .scaled(rate_scale)
                .map_err(|e| match e {
                    crate::sim::SimError::Invalid { why, .. } => {
                        LoadgenError::invalid("--rate-scale", why)
                    }
                    e => e.into(),
                })?;
            scaled = Workload {
                arrivals,
                ..scenario.workload.clone()
            };
            &scaled
        };
        let g = workload.generate_with_prefix(count, seed)?;
        let mut generated = g.requests;
        let mut send_at_ns: Vec<u64> = generated.iter().map(|r| r.arrival_ns).collect();
        if let Some(d) = duration_s {
            let end_ns = d * 1e9;
            let keep = send_at_ns.partition_point(|&t| (t as f64) < end_ns);
            generated.truncate(keep);
            send_at_ns.truncate(keep);
        }
        if generated.is_empty() {
            return Err(LoadgenError::invalid(
                "--duration",
                "no request of the workload is due within it",
            ));
        }
        debug_assert!(send_at_ns.windows(2).all(|w| w[0] <= w[1]));
        Ok(Schedule {
            digest: Digest::of(&generated),
            requests: generated,
            send_at_ns,
            trace_ids: g.trace_ids,
        })
    }

    /// Requests in the schedule.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// True when there is nothing to send (never, for a schedule built by [`Schedule::new`]).
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Seconds from the first to the last send.
    pub fn span_s(&self) -> f64 {
        match (self.send_at_ns.first(), self.send_at_ns.last()) {
            (Some(a), Some(b)) => (b - a) as f64 / 1e9,
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::scenario::builtin;

    #[test]
    fn the_schedule_is_the_simulators_sequence_scaled_and_cut() {
        let s = builtin("steady_state").unwrap();
        let full = Schedule::new(&s, 7, Some(300), None, 1.0).unwrap();
        let sim = s.workload.generate(300, 7).unwrap();
        assert_eq!(full.requests, sim);
        assert_eq!(full.digest, Digest::of(&sim));
        // 100 requests/s: request i at i x 10 ms; twice as fast: i x 5 ms.
        assert_eq!(full.send_at_ns[3], 30_000_000);
        let fast = Schedule::new(&s, 7, Some(300), None, 2.0).unwrap();
        assert_eq!(fast.send_at_ns[3], 15_000_000);
        // Twice as fast is the simulator's sequence at twice the rate, digest and all.
        let w2 = Workload {
            arrivals: s.workload.arrivals.scaled(2.0).unwrap(),
            ..s.workload.clone()
        };
        let sim2 = w2.generate(300, 7).unwrap();
        assert_eq!(fast.requests, sim2);
        assert_eq!(fast.digest, Digest::of(&sim2));
        assert_ne!(fast.digest, full.digest, "arrival times are in the digest");
        // 1 s at 100 requests/s: requests 0..100 (t = 0 .. 0.99 s), the prefix.
        let cut = Schedule::new(&s, 7, Some(300), Some(1.0), 1.0).unwrap();
        assert_eq!(cut.len(), 100);
        assert_eq!(cut.digest, Digest::of(&sim[..100]));
    }

    #[test]
    fn bad_bounds_are_errors_naming_the_flag() {
        let s = builtin("steady_state").unwrap();
        let e = Schedule::new(&s, 7, Some(0), None, 1.0).unwrap_err();
        assert!(e.to_string().contains("--requests"), "{e}");
        let e = Schedule::new(&s, 7, Some(5), None, 0.0).unwrap_err();
        assert!(e.to_string().contains("--rate-scale"), "{e}");
        let e = Schedule::new(&s, 7, Some(5), Some(-1.0), 1.0).unwrap_err();
        assert!(e.to_string().contains("--duration"), "{e}");
    }
}
