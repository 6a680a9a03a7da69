//! The sans-IO scheduling core: admission, per-class queues, flush decisions, batch
//! formation, worker selection, circuit breaking and outcome accounting.
//!
//! Driven from outside with the current time (`admit`, `poll`, `complete`), it is the same
//! code under the live runtime and the virtual-time simulator. It must never read a clock,
//! spawn or block, do I/O, or allocate after [`Core::new`]; `tests/no_alloc.rs` holds it to
//! that.
//!
//! Where `Core`'s work lives, one job a file (each an `impl Core` block): `admission`
//! (admit, readmit, cancel, drain), `queues` (class queues or bins, and switching strategy
//! between them), `flush` (`poll`: which group is due, and the next deadline),
//! `batch_form` (worker choice, filling and dispatching a batch), `expiry` (request and
//! batch timeouts, abort), `completion` (a worker's batch back), `inspect` (what drivers
//! and metrics read). This file holds the types they share and [`Core::new`].

mod admission;
pub mod balancer;
mod batch_form;
pub mod circuit;
mod completion;
pub mod continuous;
mod expiry;
mod flush;
mod inspect;
pub mod lora;
pub mod names;
pub mod pool;
pub mod prefix;
mod queues;
pub mod request;
pub mod settings;
pub mod stats;
pub mod strategy;
pub mod table;

use rand::rngs::SmallRng;
use rand::SeedableRng;

use balancer::Balancer;
use pool::WorkerView;
pub use request::{
    Kind, Nanos, Priority, RequestMeta, Ticket, BUCKET_COUNT, BUCKET_LABELS, CLASS_COUNT,
};
pub use settings::{Alone, BatchingMode, CoreConfig};
use stats::LatencyWindow;
pub use stats::{CoreStats, FlushReason};
use strategy::auto::Auto;
use strategy::research::Research;
use strategy::StrategyKind;
use table::{Fifo, RequestTable};

/// Why a request was refused at admission. Nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("the request queue is full ({capacity} requests queued or in flight); retry later")]
    QueueFull { capacity: usize },
    #[error("the server is shutting down and no longer accepts requests")]
    ShuttingDown,
    #[error("the request needs {needed} KV-cache tokens (prompt + max_tokens) but a replica holds at most {capacity}; shorten the prompt or lower max_tokens")]
    TooLarge { needed: u64, capacity: u64 },
}

/// Why an admitted request ended in an error instead of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FailReason {
    #[error("request waited in the queue past its deadline: no worker could take it")]
    QueueTimeout,
    #[error("the worker did not answer within the batch timeout")]
    BatchTimeout,
    #[error("the worker failed while processing the batch")]
    WorkerError,
    #[error("the request was cancelled by the client")]
    Cancelled,
    #[error("the server shut down before the request could be served")]
    Aborted,
}

/// Identifies one batch handed to a worker (an index into the core's batch slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchId(pub u32);

/// What the driver must do after `poll`.
#[derive(Debug)]
pub enum Action<'a> {
    /// Hand these requests, as one batch, to `worker`.
    Dispatch {
        worker: usize,
        batch: BatchId,
        reason: FlushReason,
        tickets: &'a [Ticket],
        /// LoRA adapters loaded into `worker`'s slots for this batch (each costs
        /// `lora_load_ms`).
        lora_loads: u32,
    },
    /// Answer this request with an error now; the core has forgotten it.
    Fail { ticket: Ticket, reason: FailReason },
}

/// How a worker finished a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    Ok,
    Failed,
}

/// What `complete` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The batch's requests are finished now: answer each of them (with the result on
    /// success, with [`FailReason::WorkerError`] on failure).
    Deliver,
    /// The batch had already timed out and its requests were answered; drop the results.
    Stale,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchState {
    Free,
    InFlight,
    /// Timed out: its requests were failed, the worker still holds it.
    Abandoned,
}

/// One batch slot. `tickets` has capacity `max_batch_size`, reserved in `new`.
struct BatchSlot {
    tickets: Vec<Ticket>,
    worker: u32,
    dispatched_at_ns: Nanos,
    /// Its requests' estimated tokens (set at dispatch: what `auto` learns the cost from,
    /// and how the pacing rule predicts its end).
    tokens: u64,
    state: BatchState,
    /// The `multi_bin` bin the batch came from (its statistics learn from the result).
    bin: Option<usize>,
}

/// The scheduler. See the module docs for the rules it lives by.
pub struct Core {
    cfg: CoreConfig,
    table: RequestTable,
    /// One FIFO per (priority x bucket), indexed by [`request::class_index`].
    queues: [Fifo; CLASS_COUNT],
    /// Requests in all queues.
    queued: usize,
    /// Bit `c` set iff `queues[c]` is non-empty, so scans touch only occupied classes.
    nonempty: u32,
    strategy: StrategyKind,
    workers: Vec<WorkerView>,
    /// Some worker's circuit may be open: set by every recorded failure
    /// ([`Core::record_worker_failure`]), cleared by a pick that advanced every circuit and
    /// found none open. While clear, advancing the circuits changes nothing (only an open
    /// circuit moves by time), so a pick skips that pass over the workers.
    circuits_may_be_open: bool,
    balancer: Balancer,
    rng: SmallRng,
    batches: Vec<BatchSlot>,
    /// Stack of free batch slot indices.
    free_batches: Vec<u32>,
    in_flight_batches: usize,
    stats: CoreStats,
    latencies: LatencyWindow,
    p99_refreshed_at_ns: Nanos,
    draining: bool,
    /// `dynamic` / `multi_bin` state; its bins hold the queue while `multi_bin` is active.
    /// Fed completed batches only while one of the two is in force, as `auto` below: its
    /// statistics, length predictor and SLA controller cost 266 instructions a batch of one
    /// (`core/request_cycle_auto`) and 58 a request in batches of 32 (`core/request_cycle`).
    research: Research,
    /// `auto`'s learned cost and arrivals, fed only while `auto` is in force: learning
    /// under every strategy cost 26 ns per request in `core/request_cycle` (98 -> 72 ns).
    /// Switched to at run time, `auto` starts from what it learned when it last ran (or its
    /// work-conserving prior) and catches up within ~16 completed batches.
    auto: Auto,
    /// Per worker, its LoRA adapter slots (`max_loras`; residency persists between batches).
    lora: Vec<lora::LoraSlots>,
    /// The earliest instant `auto` chose to hold a group until, at the last poll
    /// (`Nanos::MAX`: holding nothing).
    auto_hold_until: Nanos,
    /// When `auto`'s current hold began (a worker was free and it held), `Nanos::MAX` when
    /// not holding. Priority max waits bound a hold from here: they bound the delay the
    /// strategy adds, not the time a request waited for a busy worker.
    auto_hold_started: Nanos,
}

impl Core {
    /// Builds a core; every table and buffer it will ever use is allocated here.
    pub fn new(cfg: CoreConfig) -> Core {
        assert!(cfg.workers > 0, "a core needs at least one worker");
        assert!(cfg.max_batch_size > 0, "max_batch_size must be at least 1");
        let max_inflight = cfg.max_inflight_per_worker.max(1);
        // Batch slots: one per batch any worker may hold at once.
        let slot_count = cfg.workers * max_inflight as usize;
        let batch_len = max_batch_len(&cfg);
        let batches = (0..slot_count)
            .map(|_| BatchSlot {
                tickets: Vec::with_capacity(batch_len),
                worker: 0,
                dispatched_at_ns: 0,
                tokens: 0,
                state: BatchState::Free,
                bin: None,
            })
            .collect();
        let free_batches = (0..slot_count as u32).rev().collect();
        Core {
            table: RequestTable::new(cfg.queue_capacity),
            queues: [Fifo::default(); CLASS_COUNT],
            queued: 0,
            nonempty: 0,
            strategy: cfg.strategy,
            workers: vec![WorkerView::default(); cfg.workers],
            circuits_may_be_open: false,
            lora: vec![lora::LoraSlots::new(cfg.max_loras); cfg.workers],
            balancer: Balancer::new(cfg.balancer),
            rng: SmallRng::seed_from_u64(cfg.seed),
            batches,
            free_batches,
            in_flight_batches: 0,
            stats: CoreStats::default(),
            latencies: LatencyWindow::new(cfg.latency_window),
            p99_refreshed_at_ns: 0,
            draining: false,
            research: {
                let mut r = Research::new(cfg.research.clone());
                r.use_bins(cfg.strategy == StrategyKind::MultiBin);
                r
            },
            auto: Auto::for_concurrency(cfg.workers * max_inflight as usize, cfg.max_batch_size),
            auto_hold_until: Nanos::MAX,
            auto_hold_started: Nanos::MAX,
            cfg: CoreConfig {
                max_inflight_per_worker: max_inflight,
                ..cfg
            },
        }
    }
}

/// Longest batch `cfg` can form: `max_batch_size`, or the research strategies' `b_max`.
fn max_batch_len(cfg: &CoreConfig) -> usize {
    let research = cfg.research.memory.b_max.max(cfg.research.sla.b_max) as usize;
    cfg.max_batch_size.max(research).max(1)
}

#[cfg(test)]
mod tests;
