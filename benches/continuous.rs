//! Criterion bench of the continuous-batching scheduler alone.
//!
//! `continuous/tick_16_slots*`: one tick (admit into freed slots, build the step: 16 decode
//! entries) plus its completion, with 16 generating slots and a steady stream of requests
//! finishing and arriving. Divide by 16 for the cost per active slot.
//! - `tick_16_slots_no_cache`: prefix caching off (KV counted in tokens, as before it).
//! - `tick_16_slots`: the default, prefix caching on, prompts without names (blocks only).
//! - `tick_16_slots_shared_prefix`: caching on, every 512-token prompt shares its first 31
//!   blocks of 16 with every other one: each admission looks 31 names up and holds them.
//!
//! `continuous/admit_shared_prefix_31_blocks`: one admission of that prompt into a free slot
//! (31 lookups and holds) and its release; divide by 31 for the cost per cached block.

use abe::core::continuous::{Continuous, ContinuousConfig, EntryResult, StepAction};
use abe::core::prefix::{chain, BlockHash, PromptBlocks, ROOT};
use abe::core::{Kind, Priority, RequestMeta, Ticket};
use criterion::{criterion_group, Criterion};
use std::hint::black_box;

/// Every request's prompt has the same block names.
struct Shared(Vec<BlockHash>);

impl PromptBlocks for Shared {
    fn block_count(&self, _: Ticket) -> u32 {
        self.0.len() as u32
    }
    fn block_hash(&self, _: Ticket, i: u32) -> BlockHash {
        self.0[i as usize]
    }
}

fn shared_names(blocks: u64) -> Shared {
    let mut parent = ROOT;
    Shared(
        (0..blocks)
            .map(|i| {
                parent = chain(parent, i);
                parent
            })
            .collect(),
    )
}

/// The tick loop both benches run: 16 generating slots, 16-token prompts, 64 tokens out,
/// one request in 64 ending by EOS at each step, the queue kept topped up.
struct TickLoop {
    sched: Continuous,
    results: [EntryResult; 16],
    n: u64,
    prompt: u32,
}

impl TickLoop {
    fn new(caching: bool, prompt: u32) -> TickLoop {
        TickLoop {
            sched: Continuous::new(ContinuousConfig {
                max_slots: 16,
                max_queue: 4096,
                prefix_caching: caching,
                ..ContinuousConfig::default()
            }),
            results: [EntryResult::Continue; 16],
            n: 0,
            prompt,
        }
    }

    /// One tick and its completion.
    #[inline]
    fn tick(&mut self, names: &Shared) {
        // Keep the queue topped up so freed slots are refilled at once.
        while self.sched.waiting() < 16 {
            let mut m = RequestMeta::new(Priority::Normal, Kind::Completion, 64, 64, 0);
            m.tokens_estimated = self.prompt + 64;
            let _ = self.sched.admit(m);
        }
        let mut entries = 0;
        self.sched.tick_replicas(names, &mut |_| true, &mut |a| {
            if let StepAction::Step { entries: e, .. } = a {
                entries = e.len();
            }
        });
        // One request in 64 finishes by EOS at each step.
        for (i, r) in self.results.iter_mut().enumerate().take(entries) {
            self.n += 1;
            *r = if (self.n + i as u64) % 64 == 0 {
                EntryResult::Finished
            } else {
                EntryResult::Continue
            };
        }
        self.sched
            .complete_step_with(0, names, &self.results[..entries], &mut |t, _| {
                black_box(t);
            });
    }
}

fn run_ticks(c: &mut Criterion, name: &str, caching: bool, prompt: u32, names: &Shared) {
    let mut group = c.benchmark_group("continuous");
    group.bench_function(name, |b| {
        let mut l = TickLoop::new(caching, prompt);
        b.iter(|| l.tick(names));
    });
    group.finish();
}

fn tick(c: &mut Criterion) {
    let none = Shared(Vec::new());
    run_ticks(c, "tick_16_slots_no_cache", false, 16, &none);
    run_ticks(c, "tick_16_slots", true, 16, &none);
    run_ticks(
        c,
        "tick_16_slots_shared_prefix",
        true,
        512,
        &shared_names(32),
    );
}

fn admit(c: &mut Criterion) {
    let names = shared_names(32);
    let mut group = c.benchmark_group("continuous");
    group.bench_function("admit_shared_prefix_31_blocks", |b| {
        let mut sched = Continuous::new(ContinuousConfig {
            max_slots: 1,
            max_queue: 4,
            prefill_chunk: 512,
            ..ContinuousConfig::default()
        });
        // Cache the prompt once: a 512-token prefill, then the request ends.
        let mut m = RequestMeta::new(Priority::Normal, Kind::Completion, 0, 1, 0);
        m.tokens_estimated = 512 + 1;
        let done = [EntryResult::Finished];
        let _ = sched.admit(m);
        sched.tick_replicas(&names, &mut |_| true, &mut |_| {});
        sched.complete_step_with(0, &names, &done, &mut |_, _| {});
        b.iter(|| {
            // Admission (31 lookups and holds) and a one-token prefill, then the release.
            let _ = sched.admit(m);
            sched.tick_replicas(&names, &mut |_| true, &mut |a| {
                if let StepAction::Step { entries, .. } = a {
                    black_box(entries.prefills()[0]);
                }
            });
            sched.complete_step_with(0, &names, &done, &mut |t, _| {
                black_box(t);
            });
        });
        assert!(sched.prefix_stats().hit_tokens > 0, "the bench must hit");
    });
    group.finish();
}

criterion_group!(benches, tick, admit);

/// `TICK_COUNT=N` (and `TICK_CACHING=on|off`, default on) runs `N` ticks of the
/// `tick_16_slots` loop (16-token prompts, no names) and nothing else, for an instruction
/// count per tick under callgrind (`tools/bench/tick_instructions.sh`): the difference
/// between two counts over the difference in ticks. Otherwise the criterion benches.
fn main() {
    if let Some(ticks) = std::env::var("TICK_COUNT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let caching = std::env::var("TICK_CACHING").map_or(true, |v| v != "off");
        let none = Shared(Vec::new());
        let mut l = TickLoop::new(caching, 16);
        for _ in 0..ticks {
            l.tick(&none);
        }
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
