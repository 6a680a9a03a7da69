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

/// How a request's token times are kept ([`TokenState::mode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenMode {
    /// Not generating: waiting for its first token, or preempted (its `delivered` and
    /// `last_ns` are its own).
    #[default]
    Waiting,
    /// Generating on a replica and sampled in every step of it since its first token: its
    /// latest token is the replica's last step end and its count follows from the
    /// replica's steps ([`TokenRecord`]'s per-replica clock), so its tokens are counted
    /// per step, not one by one.
    Clocked,
    /// Generating, but a step left it out or it regenerates tokens after a preemption: timed
    /// token by token from its own `delivered` and `last_ns` until it leaves the replica.
    Tracked,
}

/// Token timing of one request while it is in the scheduler.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenState {
    /// Arrival, virtual ns.
    pub arrival_ns: u64,
    /// When its first token was sampled (0: not yet).
    pub first_ns: u64,
    /// When its latest token was sampled (not kept while `Clocked`).
    pub last_ns: u64,
    /// Tokens delivered so far (not kept while `Clocked`). After a preemption the request
    /// is prefilled again and regenerates its tokens; only tokens past this count are new
    /// to the client.
    pub delivered: u32,
    /// It left the wait queue for a slot at least once (queue wait counted once).
    pub dispatched: bool,
    pub mode: TokenMode,
    /// While `Clocked`: its replica's step count when the step giving its first token ran.
    first_step: u64,
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
    /// Per replica: when its last step ended (the latest token of its `Clocked` requests),
    /// its steps completed, and its `Tracked` requests (none: a step's decode tokens are
    /// all `Clocked` and timed together by [`Self::on_decodes`]).
    end_ns: Vec<u64>,
    steps_done: Vec<u64>,
    tracked: Vec<u32>,
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
            end_ns: vec![0; replicas],
            steps_done: vec![0; replicas],
            tracked: vec![0; replicas],
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

    /// Does `replica` run a request timed token by token? (If not, a step's decode tokens
    /// are timed together: [`Self::on_decodes`].)
    pub fn tracks(&self, replica: usize) -> bool {
        self.tracked[replica] > 0
    }

    /// Makes the `Clocked` request in `index` on `replica` keep its own count and latest
    /// token time, as they stand between two steps.
    fn unclock(&mut self, replica: usize, index: u32) {
        let s = &mut self.state[index as usize];
        debug_assert_eq!(s.mode, TokenMode::Clocked);
        s.delivered = (self.steps_done[replica] - s.first_step) as u32;
        s.last_ns = self.end_ns[replica];
    }

    /// A step starting on `replica` leaves out the generating request in `index` (the
    /// token budget): from now on it is timed token by token.
    pub fn on_skipped(&mut self, replica: usize, index: u32) {
        if self.state[index as usize].mode == TokenMode::Clocked {
            self.unclock(replica, index);
            self.state[index as usize].mode = TokenMode::Tracked;
            self.tracked[replica] += 1;
        }
    }

    /// The request in `index` was preempted on `replica` (between two of its steps).
    pub fn on_preempted(&mut self, replica: usize, index: u32) {
        self.preemptions += 1;
        match self.state[index as usize].mode {
            TokenMode::Clocked => self.unclock(replica, index),
            TokenMode::Tracked => self.tracked[replica] -= 1,
            TokenMode::Waiting => {}
        }
        self.state[index as usize].mode = TokenMode::Waiting;
    }

    /// A step of `replica` ending at `now_ns` sampled `n` decode tokens, all of `Clocked`
    /// requests (`!self.tracks(replica)`): each is new to its client and follows its
    /// previous token by the same gap, the time since the replica's last step ended.
    pub fn on_decodes(&mut self, replica: usize, n: u64, now_ns: u64) {
        debug_assert!(!self.tracks(replica));
        if n > 0 {
            self.itl(now_ns.saturating_sub(self.end_ns[replica]), n);
        }
    }

    /// A step of `replica` ending at `now_ns` sampled the decode token number `generated`
    /// (0-based) of the request in `index` (when `self.tracks(replica)`).
    pub fn on_decode(&mut self, replica: usize, index: u32, generated: u32, now_ns: u64) {
        let s = &mut self.state[index as usize];
        match s.mode {
            TokenMode::Clocked => {
                let gap = now_ns.saturating_sub(self.end_ns[replica]);
                self.itl(gap, 1);
            }
            TokenMode::Tracked => {
                if generated < s.delivered {
                    return; // regenerated after a preemption: the client has it already
                }
                let gap = now_ns.saturating_sub(s.last_ns);
                s.last_ns = now_ns;
                s.delivered += 1;
                self.itl(gap, 1);
            }
            TokenMode::Waiting => unreachable!("a decode token of a request not generating"),
        }
    }

    /// A step of `replica` ending at `now_ns` finished the prompt of the request in
    /// `index` and sampled its token 0: its first token, or one its client already has
    /// (prefilled again after a preemption).
    pub fn on_first_token(&mut self, replica: usize, index: u32, now_ns: u64) {
        let s = &mut self.state[index as usize];
        debug_assert_eq!(s.mode, TokenMode::Waiting);
        if s.delivered > 0 {
            s.mode = TokenMode::Tracked;
            self.tracked[replica] += 1;
            return;
        }
        s.first_ns = now_ns;
        s.mode = TokenMode::Clocked;
        s.first_step = self.steps_done[replica];
        let ttft = now_ns.saturating_sub(s.arrival_ns);
        self.ttft_ns.saturating_record(ttft.max(1));
        self.ttft_sum_ns += u128::from(ttft);
    }

    /// `n` inter-token gaps of `gap` ns.
    #[inline]
    fn itl(&mut self, gap: u64, n: u64) {
        self.itl_sum_ns += u128::from(gap) * u128::from(n);
        let gap = gap.max(1);
        if gap == self.itl_run.0 {
            self.itl_run.1 += n;
        } else {
            let (g, k) = std::mem::replace(&mut self.itl_run, (gap, n));
            if k > 0 {
                self.itl_ns.saturating_record_n(g, k);
            }
        }
    }

    /// The step of `replica` ending at `now_ns` is complete (after its tokens and
    /// finishes).
    pub fn on_step_end(&mut self, replica: usize, now_ns: u64) {
        self.end_ns[replica] = now_ns;
        self.steps_done[replica] += 1;
    }

    /// Records the pending run of equal inter-token gaps; `itl_ns` is complete after it.
    pub fn flush(&mut self) {
        let (gap, n) = std::mem::take(&mut self.itl_run);
        if n > 0 {
            self.itl_ns.saturating_record_n(gap, n);
        }
    }

    /// The request in `index` completed on `replica` at `now_ns`, in the step ending then
    /// (before [`Self::on_step_end`]).
    pub fn on_finish(&mut self, replica: usize, index: u32, now_ns: u64) {
        let s = self.state[index as usize];
        let delivered = match s.mode {
            // Its tokens: one a step from its first one's to this one.
            TokenMode::Clocked => (self.steps_done[replica] - s.first_step + 1) as u32,
            TokenMode::Tracked => {
                self.tracked[replica] -= 1;
                s.delivered
            }
            TokenMode::Waiting => s.delivered,
        };
        self.state[index as usize].mode = TokenMode::Waiting;
        let ttft = s.first_ns.saturating_sub(s.arrival_ns);
        let tpot = if delivered > 1 {
            let tpot = now_ns.saturating_sub(s.first_ns) / u64::from(delivered - 1);
            self.tpot_ns.saturating_record(tpot.max(1));
            self.tpot_sum_ns += u128::from(tpot);
            tpot
        } else {
            0
        };
        if delivered > 0 && ttft <= self.ttft_target_ns && tpot <= self.tpot_target_ns {
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
        t.on_first_token(0, 2, 1_050); // TTFT 50
        t.on_step_end(0, 1_050);
        t.on_decodes(0, 1, 1_060); // gap 10
        t.on_step_end(0, 1_060);
        t.on_decodes(0, 1, 1_080); // gap 20
        t.on_finish(0, 2, 1_080);
        t.on_step_end(0, 1_080);
        t.flush();
        assert_eq!(t.itl_ns.len(), 2, "two gaps after the first token");
        assert_eq!(t.ttft_sum_ns, 50);
        assert_eq!(t.itl_sum_ns, 30);
        assert_eq!(t.tpot_sum_ns, 15, "30 ns over the 2 tokens after the first");
        assert_eq!(t.goodput_met, 0, "TPOT 15 misses the 10 ns target");
        t.on_admit(0, 0);
        t.on_first_token(0, 0, 1_100);
        t.on_finish(0, 0, 1_100);
        assert_eq!(t.goodput_met, 0, "TTFT 1,100 misses the 100 ns target");
        t.on_step_end(0, 1_100);
        t.on_admit(1, 1_150);
        t.on_first_token(0, 1, 1_200);
        t.on_finish(0, 1, 1_200);
        assert_eq!(t.goodput_met, 1, "one token: TTFT alone decides");
    }

    /// One request as the scheduler runs it, for the reference: the token it samples next
    /// and whether it is in the replica's steps.
    struct Seq {
        index: u32,
        generated: u32,
        prefill_left: u32,
        max_tokens: u32,
    }

    /// Times every token one by one (the record's behaviour before tokens were counted per
    /// step): the reference the per-step counts must equal.
    #[derive(Default)]
    struct Naive {
        last: [u64; 8],
        delivered: [u32; 8],
        first: [u64; 8],
        itl: Vec<u64>,
        tpot: Vec<u64>,
    }

    impl Naive {
        fn token(&mut self, i: usize, generated: u32, now: u64) {
            if generated < self.delivered[i] {
                return;
            }
            if self.delivered[i] == 0 {
                self.first[i] = now;
            } else {
                self.itl.push(now - self.last[i]);
            }
            self.last[i] = now;
            self.delivered[i] += 1;
        }
    }

    #[test]
    fn tokens_counted_per_step_equal_tokens_timed_one_by_one() {
        // One replica, five requests: one left out of two steps by the token budget, one
        // preempted after six tokens and prefilled again (it regenerates them), with step
        // times that vary, so gaps differ between requests.
        let mut t = TokenRecord::new(8, u64::MAX, u64::MAX, 1000, 8, 1);
        let mut naive = Naive::default();
        let mut seqs: Vec<Seq> = (0..5)
            .map(|i| Seq {
                index: i,
                generated: 0,
                prefill_left: 1 + i % 3,
                max_tokens: 9 + 4 * i,
            })
            .collect();
        for s in &seqs {
            t.on_admit(s.index, 0);
        }
        let mut now = 0u64;
        for step in 0..60u64 {
            // Step start: preempt request 1 at step 10; leave request 3 out of steps 7, 8.
            if step == 10 {
                if let Some(k) = seqs.iter().position(|s| s.index == 1) {
                    t.on_preempted(0, 1);
                    seqs[k].generated = 0;
                    seqs[k].prefill_left = 2;
                }
            }
            let skipped = |s: &Seq| (step == 7 || step == 8) && s.index == 3;
            for s in seqs.iter().filter(|s| s.prefill_left == 0 && skipped(s)) {
                t.on_skipped(0, s.index);
            }
            now += 1_000 + (step * 37) % 500;
            // Step end: decode tokens, then prefills (one chunk each).
            let decoding: Vec<usize> = (0..seqs.len())
                .filter(|&k| seqs[k].prefill_left == 0 && !skipped(&seqs[k]))
                .collect();
            if t.tracks(0) {
                for &k in &decoding {
                    t.on_decode(0, seqs[k].index, seqs[k].generated, now);
                }
            } else {
                t.on_decodes(0, decoding.len() as u64, now);
            }
            for &k in &decoding {
                naive.token(seqs[k].index as usize, seqs[k].generated, now);
                seqs[k].generated += 1;
            }
            for s in seqs.iter_mut().filter(|s| s.prefill_left > 0) {
                s.prefill_left -= 1;
                if s.prefill_left == 0 {
                    t.on_first_token(0, s.index, now);
                    naive.token(s.index as usize, 0, now);
                    s.generated = 1;
                }
            }
            seqs.retain(|s| {
                let done = s.prefill_left == 0 && s.generated >= s.max_tokens;
                if done {
                    t.on_finish(0, s.index, now);
                    let i = s.index as usize;
                    naive
                        .tpot
                        .push((now - naive.first[i]) / u64::from(naive.delivered[i] - 1));
                }
                !done
            });
            t.on_step_end(0, now);
        }
        assert!(seqs.is_empty(), "every request finished");
        assert!(!t.tracks(0), "nothing tracked once they left");
        t.flush();
        let mut itl = latency_histogram();
        for &g in &naive.itl {
            itl.record(g).unwrap();
        }
        assert_eq!(t.itl_ns, itl, "the same gaps");
        assert_eq!(t.itl_sum_ns, naive.itl.iter().map(|&g| u128::from(g)).sum());
        assert_eq!(
            t.tpot_sum_ns,
            naive.tpot.iter().map(|&g| u128::from(g)).sum(),
            "each request's token count and first token as counted one by one"
        );
        assert_eq!(t.tpot_ns.len(), 5);
        assert_eq!(
            t.ttft_ns.len(),
            5,
            "one first token each, the replay's not counted"
        );
    }
}
