//! What a continuous-batching run measures per token: time to first token (TTFT), time per
//! output token (TPOT, per request: the decode time after the first token over the tokens
//! after it), inter-token latency (ITL, every gap between two tokens of a request), goodput
//! (requests meeting both a TTFT and a TPOT target), steps, KV-cache use and slot occupancy.
//!
//! Every buffer is sized when the run starts (one [`TokenState`] per request-table slot of
//! the scheduler, histograms over a fixed range); recording is O(1) and allocation-free.
//! Times are virtual ns; nothing here reads a clock.

use crate::latency_histogram::latency_histogram;
use hdrhistogram::Histogram;

/// Token timing of one request while it is in the scheduler.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenState {
    /// Arrival, virtual ns.
    pub arrival_ns: u64,
    /// When its first token was sampled (0: not yet).
    pub first_ns: u64,
    /// When its latest token was sampled.
    pub last_ns: u64,
    /// Tokens delivered so far. After a preemption the request is prefilled again and
    /// regenerates its tokens; only tokens past this count are new to the client.
    pub delivered: u32,
    /// It left the wait queue for a slot at least once (queue wait counted once).
    pub dispatched: bool,
}

/// Token-level measurements of one continuous run.
#[derive(Clone, Debug)]
pub struct TokenRecord {
    pub ttft_ns: Histogram<u64>,
    pub ttft_sum_ns: u128,
    /// Per completed request with more than one token.
    pub tpot_ns: Histogram<u64>,
    pub tpot_sum_ns: u128,
    /// Per token after a request's first. Read it after [`TokenRecord::flush`]: equal
    /// consecutive gaps are counted in `itl_run` and recorded as one `record_n`.
    pub itl_ns: Histogram<u64>,
    pub itl_sum_ns: u128,
    /// The gap being repeated and how many times it repeated, not yet in `itl_ns` (every
    /// sequence that decoded in a replica's previous step sees the same gap, so one step's
    /// tokens are mostly one run).
    itl_run: (u64, u64),
    /// Completed requests whose TTFT and TPOT both met their targets.
    pub goodput_met: u64,
    pub ttft_target_ns: u64,
    pub tpot_target_ns: u64,
    /// Forward passes, and the decode and prefill tokens in them.
    pub steps: u64,
    pub decode_tokens: u64,
    pub prefill_tokens: u64,
    pub preemptions: u64,
    /// Integral over step time of the replica's KV tokens in use (token-ns) and of its
    /// active slots (slot-ns).
    pub kv_token_ns: u128,
    pub slot_ns: u128,
    /// Most KV tokens one replica held at the start of a step.
    pub kv_peak_tokens: u64,
    /// Per replica.
    pub kv_capacity_tokens: u64,
    pub slots_per_replica: u64,
    pub replicas: u64,
    /// Prefix-cache counters at the end of the run (`None`: prefix caching off).
    pub prefix: Option<crate::core::prefix::PrefixStats>,
    /// Indexed by the scheduler's request-table slot (`Ticket::index`).
    pub state: Vec<TokenState>,
}

impl TokenRecord {
    /// A record for a scheduler with `table_slots` request slots.
    pub fn new(
        table_slots: usize,
        ttft_target_ns: u64,
        tpot_target_ns: u64,
        kv_capacity_tokens: u64,
        slots_per_replica: usize,
        replicas: usize,
    ) -> Self {
        TokenRecord {
            ttft_ns: latency_histogram(),
            ttft_sum_ns: 0,
            tpot_ns: latency_histogram(),
            tpot_sum_ns: 0,
            itl_ns: latency_histogram(),
            itl_sum_ns: 0,
            itl_run: (0, 0),
            goodput_met: 0,
            ttft_target_ns,
            tpot_target_ns,
            steps: 0,
            decode_tokens: 0,
            prefill_tokens: 0,
            preemptions: 0,
            kv_token_ns: 0,
            slot_ns: 0,
            kv_peak_tokens: 0,
            kv_capacity_tokens,
            slots_per_replica: slots_per_replica as u64,
            replicas: replicas as u64,
            prefix: None,
            state: vec![TokenState::default(); table_slots],
        }
    }

    /// A request entered table slot `index`.
    pub fn on_admit(&mut self, index: u32, arrival_ns: u64) {
        self.state[index as usize] = TokenState {
            arrival_ns,
            ..TokenState::default()
        };
    }

    /// The request in `index` got a slot; true the first time (its queue wait ends).
    pub fn on_slot(&mut self, index: u32) -> bool {
        !std::mem::replace(&mut self.state[index as usize].dispatched, true)
    }

    /// A step with these tokens started.
    pub fn on_step(&mut self, decode: u32, prefill: u32) {
        self.steps += 1;
        self.decode_tokens += u64::from(decode);
        self.prefill_tokens += u64::from(prefill);
    }

    /// A replica holding `kv_tokens` in `active_slots` slots runs a step of `ns`.
    pub fn on_occupancy(&mut self, kv_tokens: u64, active_slots: usize, ns: u64) {
        self.kv_token_ns += u128::from(kv_tokens) * u128::from(ns);
        self.slot_ns += active_slots as u128 * u128::from(ns);
        self.kv_peak_tokens = self.kv_peak_tokens.max(kv_tokens);
    }

    /// The request in `index` sampled its output token number `generated` (0-based) at
    /// `now_ns`.
    pub fn on_token(&mut self, index: u32, generated: u32, now_ns: u64) {
        let s = &mut self.state[index as usize];
        if generated < s.delivered {
            return; // regenerated after a preemption: the client has it already
        }
        if s.delivered == 0 {
            s.first_ns = now_ns;
            let ttft = now_ns.saturating_sub(s.arrival_ns);
            self.ttft_ns.saturating_record(ttft.max(1));
            self.ttft_sum_ns += u128::from(ttft);
        } else {
            let gap = now_ns.saturating_sub(s.last_ns);
            self.itl_sum_ns += u128::from(gap);
            let gap = gap.max(1);
            if gap == self.itl_run.0 {
                self.itl_run.1 += 1;
            } else {
                let (g, n) = std::mem::replace(&mut self.itl_run, (gap, 1));
                if n > 0 {
                    self.itl_ns.saturating_record_n(g, n);
                }
            }
        }
        s.last_ns = now_ns;
        s.delivered += 1;
    }

    /// Records the pending run of equal inter-token gaps; `itl_ns` is complete after it.
    pub fn flush(&mut self) {
        let (gap, n) = std::mem::take(&mut self.itl_run);
        if n > 0 {
            self.itl_ns.saturating_record_n(gap, n);
        }
    }

    /// The request in `index` completed at `now_ns`.
    pub fn on_finish(&mut self, index: u32, now_ns: u64) {
        let s = self.state[index as usize];
        let ttft = s.first_ns.saturating_sub(s.arrival_ns);
        let tpot = if s.delivered > 1 {
            let tpot = now_ns.saturating_sub(s.first_ns) / u64::from(s.delivered - 1);
            self.tpot_ns.saturating_record(tpot.max(1));
            self.tpot_sum_ns += u128::from(tpot);
            tpot
        } else {
            0
        };
        if s.delivered > 0 && ttft <= self.ttft_target_ns && tpot <= self.tpot_target_ns {
            self.goodput_met += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttft_itl_tpot_and_goodput_of_one_request() {
        let mut t = TokenRecord::new(4, 100, 10, 1000, 2, 1);
        t.on_admit(2, 1_000);
        assert!(t.on_slot(2));
        assert!(!t.on_slot(2));
        t.on_token(2, 0, 1_050); // TTFT 50
        t.on_token(2, 1, 1_060); // gap 10
        t.on_token(2, 2, 1_080); // gap 20
        t.on_token(2, 1, 1_500); // regenerated after a preemption: ignored
        t.on_finish(2, 1_080);
        t.flush();
        assert_eq!(t.itl_ns.len(), 2, "two gaps after the first token");
        assert_eq!(t.ttft_sum_ns, 50);
        assert_eq!(t.itl_sum_ns, 30);
        assert_eq!(t.tpot_sum_ns, 15);
        assert_eq!(t.goodput_met, 0, "TPOT 15 misses the 10 ns target");
        t.on_admit(0, 0);
        t.on_token(0, 0, 100);
        t.on_finish(0, 100);
        assert_eq!(t.goodput_met, 1, "one token: TTFT alone decides");
    }

    #[test]
    fn itl_runs_record_what_one_record_per_gap_records() {
        // Three requests decoding in lockstep, then apart: runs of equal gaps and changes.
        let mut t = TokenRecord::new(3, u64::MAX, u64::MAX, 1000, 3, 1);
        let mut naive = latency_histogram();
        let mut now = 0;
        for i in 0..3 {
            t.on_admit(i, 0);
        }
        for step in 0..40u32 {
            now += if step % 7 == 0 { 5_000_000 } else { 1_200_000 };
            for i in 0..3u32 {
                if step > 30 && i == 2 {
                    continue; // finished: the others' gaps no longer run with its
                }
                let at = now + u64::from(i) * u64::from(step > 20);
                if t.state[i as usize].delivered > 0 {
                    naive.record(at - t.state[i as usize].last_ns).unwrap();
                }
                t.on_token(i, step, at);
            }
        }
        t.flush();
        assert_eq!(t.itl_ns, naive, "the same counts in the same buckets");
        assert_eq!(t.itl_ns.len(), 3 * 39 - 9);
    }
}
