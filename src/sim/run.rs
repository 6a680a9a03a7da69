//! `abe simulate` as a library call: resolve the scenario, layer flags and sweep points over
//! it, generate the request sequence once, run every (sweep point x strategy) through the
//! driver, and assemble the report.
//!
//! Runs are independent, so they may execute on several threads (`jobs`); results are put
//! back in grid order, so the report does not depend on scheduling. Nothing here prints,
//! writes files or reads the clock.

use super::binning::interleave_bins;
use super::continuous::ContinuousInput;
use super::driver::{self, RunInput, RunOutput};
use super::report::{ParamValue, RunReport, SimReport, SweepAxis};
use super::scenario::Scenario;
use super::settings::EngineSettings;
use super::sweep;
use super::workload::{Digest, SimRequest};
use super::SimError;
use crate::core::continuous::ContinuousConfig;
use crate::core::prefix::PrefixStats;
use crate::core::request::ms_to_nanos;
use crate::core::strategy::StrategyKind;
use crate::core::{BatchingMode, CoreConfig};
use crate::exec::latency::{LatencyKind, LatencyModel, NAME_KEYS, PARAM_KEYS};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Everything `abe simulate` takes besides output paths.
#[derive(Clone, Debug)]
pub struct SimulateOptions {
    /// A built-in scenario name or the path of a scenario file.
    pub scenario: String,
    /// Strategy names; empty means every strategy.
    pub strategies: Vec<String>,
    pub seed: u64,
    /// Overrides the scenario's request count (a replayed trace: its first N rows).
    pub requests: Option<u64>,
    /// Replays this trace file: the scenario's arrivals and request shapes come from it. With
    /// `scenario` empty, the base is [`Scenario::replay`]'s.
    pub trace: Option<PathBuf>,
    /// Plays the workload this many times faster: every arrival rate times it (a trace's
    /// timestamps divided by it), as the `rate_scale` sweep key.
    pub rate_scale: Option<f64>,
    /// Replaces the scenario's latency model (with that model's defaults).
    pub latency_model: Option<String>,
    /// `key=value` overrides of the latency model's parameters.
    pub latency_params: Vec<String>,
    /// Engine settings from flags, layered over the scenario's.
    pub engine: EngineSettings,
    /// Overrides the scenario's SLA.
    pub sla_ms: Option<f64>,
    /// `key=v1,v2,...` sweep axes.
    pub sweep: Vec<String>,
    /// Time-series window, ms.
    pub window_ms: f64,
    /// Runs executed at once (0: one per available core).
    pub jobs: usize,
    /// Override the scenario's goodput targets (continuous mode), ms.
    pub ttft_target_ms: Option<f64>,
    pub tpot_target_ms: Option<f64>,
}

impl Default for SimulateOptions {
    fn default() -> Self {
        SimulateOptions {
            scenario: "steady_state".into(),
            strategies: Vec::new(),
            seed: 7,
            requests: None,
            trace: None,
            rate_scale: None,
            latency_model: None,
            latency_params: Vec::new(),
            engine: EngineSettings::default(),
            sla_ms: None,
            sweep: Vec::new(),
            window_ms: 1000.0,
            jobs: 0,
            ttft_target_ms: None,
            tpot_target_ms: None,
        }
    }
}

/// One run to execute.
struct Job {
    /// The strategy's name, or `continuous`.
    name: &'static str,
    /// Continuous batching: the scheduler's settings (`core` then only gives the request
    /// timeout).
    continuous: Option<ContinuousConfig>,
    /// Continuous: the router in front of the replicas (`None`: one central queue).
    routing: Option<super::cluster::ClusterRouting>,
    params: Vec<ParamValue>,
    core: CoreConfig,
    /// Oracle pre-binning into this many bins (1: feed requests in arrival order).
    presort_bins: usize,
    /// Which generated request sequence this run is offered (index into the sequences).
    workload: usize,
    /// The closed loop of this run's workload, if it is one.
    closed: Option<super::arrivals::ClosedLoop>,
    /// The adapter mix and load cost (`max_loras` is in the scheduler settings).
    lora: super::settings::SimLora,
}

fn parse_latency_params(params: &[String]) -> Result<Vec<(String, String)>, SimError> {
    params
        .iter()
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| SimError::invalid("--latency", format!("'{p}' is not key=value")))?;
            Ok((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The scenario's latency model, or the one `--latency-model` names (with its defaults),
/// with `--latency key=value` overrides (numbers, or preset names for `llm` and `gpu`).
fn latency_model(
    scenario: &Scenario,
    name: Option<&str>,
    overrides: &[(String, String)],
) -> Result<LatencyModel, SimError> {
    if let Some((key, _)) = overrides
        .iter()
        .find(|(k, _)| !PARAM_KEYS.contains(&k.as_str()) && !NAME_KEYS.contains(&k.as_str()))
    {
        return Err(SimError::invalid(
            "--latency",
            format!("unknown latency key '{key}'; see `abe simulate --help`"),
        ));
    }
    let base = match name {
        Some(name) => name
            .parse::<LatencyKind>()
            .map_err(|why| SimError::invalid("latency model", why))?
            .default_model(),
        None => scenario.latency,
    };
    base.with_overrides(overrides)
        .map_err(|why| SimError::invalid("latency model", why))
}

/// Resolves `opts.scenario` (with `opts.trace` replayed in it, `opts.rate_scale` applied)
/// and runs it.
pub fn simulate(opts: &SimulateOptions) -> Result<SimReport, SimError> {
    let mut scenario = match &opts.trace {
        Some(path) if opts.scenario.is_empty() => Scenario::replay(path),
        Some(path) => Scenario::resolve(&opts.scenario)?.with_trace(path),
        None => Scenario::resolve(&opts.scenario)?,
    };
    if let Some(k) = opts.rate_scale {
        scenario.workload.arrivals = scenario.workload.arrivals.scaled(k).map_err(|e| match e {
            SimError::Invalid { why, .. } => SimError::invalid("--rate-scale", why),
            e => e,
        })?;
    }
    simulate_scenario(&scenario, opts)
}

/// Runs `scenario` with `opts` (its `scenario` field is ignored).
pub fn simulate_scenario(
    scenario: &Scenario,
    opts: &SimulateOptions,
) -> Result<SimReport, SimError> {
    let strategies: Vec<StrategyKind> = if opts.strategies.is_empty() {
        StrategyKind::ALL.to_vec()
    } else {
        opts.strategies
            .iter()
            .map(|s| s.trim().parse::<StrategyKind>())
            .collect::<Result<_, _>>()?
    };
    let requests = opts.requests.unwrap_or(scenario.requests);
    if requests == 0 || requests >= u64::from(u32::MAX) {
        return Err(SimError::invalid(
            "requests",
            format!("{requests} must be in 1..{}", u32::MAX),
        ));
    }
    let overrides = parse_latency_params(&opts.latency_params)?;
    let latency = latency_model(scenario, opts.latency_model.as_deref(), &overrides)?;
    let sla_ms = opts.sla_ms.unwrap_or(scenario.sla_ms);
    let ttft_target_ms = opts.ttft_target_ms.unwrap_or(scenario.ttft_target_ms);
    let tpot_target_ms = opts.tpot_target_ms.unwrap_or(scenario.tpot_target_ms);
    for (key, v) in [
        ("sla_ms", sla_ms),
        ("ttft_target_ms", ttft_target_ms),
        ("tpot_target_ms", tpot_target_ms),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(SimError::invalid(key, format!("{v} must be >= 0")));
        }
    }
    if !(opts.window_ms.is_finite() && opts.window_ms >= 1.0) {
        return Err(SimError::invalid(
            "window_ms",
            format!("{} must be at least 1", opts.window_ms),
        ));
    }
    let mut engine = scenario.engine.overlay(&opts.engine);
    if engine.routing.is_none() {
        engine.routing = scenario.routing.map(|r| r.strategy);
    }
    let axes = opts
        .sweep
        .iter()
        .map(|s| sweep::parse_axis(s))
        .collect::<Result<Vec<_>, _>>()?;

    // Request sequences: the scenario's, first, and one more per sweep point that changes
    // the workload (rate_scale, clients).
    let base = scenario
        .workload
        .generate_with_prefix(requests, opts.seed)?;
    let mut sequences = vec![base.requests];
    // Per sequence, its requests' prompt-block names (empty: no prefix identity).
    let mut arenas = vec![base.arena];
    let base_closed = scenario.workload.arrivals.closed_loop()?;
    let mut jobs = Vec::new();
    for point in sweep::grid(&axes) {
        let settings = sweep::apply(&engine, &point);
        let (workload, closed) = match sweep::arrivals(&scenario.workload.arrivals, &point)? {
            None => (0, base_closed),
            Some(arrivals) => {
                let w = super::workload::Workload {
                    arrivals,
                    ..scenario.workload.clone()
                };
                let g = w.generate_with_prefix(requests, opts.seed)?;
                sequences.push(g.requests);
                arenas.push(g.arena);
                (sequences.len() - 1, w.arrivals.closed_loop()?)
            }
        };
        let oracle_bins = settings.oracle_bins.unwrap_or(1) as usize;
        if oracle_bins > 1 && !scenario.workload.arrivals.is_saturated() {
            return Err(SimError::invalid(
                "oracle_bins",
                "oracle pre-binning needs `process = \"saturated\"` arrivals (for other \
                 workloads use the multi_bin strategy and the bins key)",
            ));
        }
        if settings.batching_mode() == BatchingMode::Continuous {
            if closed.is_some() {
                return Err(SimError::invalid(
                    "mode",
                    "continuous mode runs open-loop workloads only (closed loops are driven \
                     by the request-level simulator)",
                ));
            }
            jobs.push(Job {
                name: "continuous",
                continuous: Some(settings.continuous_config(&latency)?),
                routing: settings.routing,
                params: point
                    .iter()
                    .map(|&(k, v)| ParamValue {
                        key: k.as_str().to_string(),
                        value: v,
                    })
                    .collect(),
                core: settings.core_config(strategies[0], opts.seed)?,
                presort_bins: 1,
                workload,
                closed,
                lora: settings.sim_lora()?,
            });
            continue;
        }
        if settings.routing.is_some() {
            return Err(SimError::invalid(
                "routing",
                "a routing strategy puts continuous replicas behind a router: it needs \
                 `--mode continuous`",
            ));
        }
        for &strategy in &strategies {
            jobs.push(Job {
                name: strategy.as_str(),
                continuous: None,
                routing: None,
                params: point
                    .iter()
                    .map(|&(k, v)| ParamValue {
                        key: k.as_str().to_string(),
                        value: v,
                    })
                    .collect(),
                core: settings.core_config(strategy, opts.seed)?,
                presort_bins: oracle_bins,
                workload,
                closed,
                lora: settings.sim_lora()?,
            });
        }
    }

    let generated = &sequences[0];
    let input = RunContext {
        routing_prefix: scenario.routing.and_then(|r| r.prefix),
        sequences: &sequences,
        arenas: &arenas,
        latency: &latency,
        seed: opts.seed,
        sla_ns: ms_to_nanos(sla_ms),
        window_ns: ms_to_nanos(opts.window_ms),
        ttft_target_ns: ms_to_nanos(ttft_target_ms),
        tpot_target_ns: ms_to_nanos(tpot_target_ms),
    };
    let outputs = execute(&input, &jobs, opts.jobs)?;

    let mut runs = Vec::with_capacity(jobs.len());
    let mut series = Vec::with_capacity(jobs.len());
    for (job, out) in jobs.iter().zip(outputs) {
        runs.push(RunReport::new(job.name, job.params.clone(), &out));
        series.push(out.record.series);
    }
    Ok(SimReport {
        scenario: scenario.name.clone(),
        description: scenario.description.clone(),
        seed: opts.seed,
        requests: generated.len() as u64,
        request_digest: Digest::of(generated).hex(),
        sla_ms,
        window_s: opts.window_ms / 1e3,
        latency,
        engine,
        strategies: strategies.iter().map(|s| s.as_str().to_string()).collect(),
        sweep: axes
            .iter()
            .map(|a| SweepAxis {
                key: a.key.as_str().to_string(),
                values: a.values.clone(),
            })
            .collect(),
        runs,
        series,
    })
}

/// What every run shares.
struct RunContext<'a> {
    /// The scenario's `[routing.prefix]`, if any.
    routing_prefix: Option<crate::router::PrefixConfig>,
    /// The request sequences the jobs index into.
    sequences: &'a [Vec<SimRequest>],
    /// Per sequence, the prompt-block names its requests' `prefix` spans point into.
    arenas: &'a [super::prefix::PrefixArena],
    latency: &'a LatencyModel,
    seed: u64,
    sla_ns: u64,
    window_ns: u64,
    ttft_target_ns: u64,
    tpot_target_ns: u64,
}

fn run_one(ctx: &RunContext<'_>, job: &Job) -> Result<RunOutput, SimError> {
    let binned;
    let sequence = &ctx.sequences[job.workload][..];
    if let Some(sched) = &job.continuous {
        let input = ContinuousInput {
            requests: sequence,
            prefix: &ctx.arenas[job.workload],
            sched: sched.clone(),
            latency: ctx.latency,
            request_timeout_ns: job.core.request_timeout_ns,
            sla_ns: ctx.sla_ns,
            window_ns: ctx.window_ns,
            ttft_target_ns: ctx.ttft_target_ns,
            tpot_target_ns: ctx.tpot_target_ns,
            routing: job.routing,
            routing_prefix: ctx.routing_prefix,
            seed: ctx.seed,
            lora: job.lora,
        };
        let mut out = super::continuous::run(input.clone())?;
        if let Some(cluster) = &mut out.cluster {
            (cluster.reference, cluster.unbounded) = reference(&input);
        }
        return Ok(out);
    }
    let requests = if job.presort_bins > 1 {
        binned = interleave_bins(sequence, job.presort_bins, job.core.max_batch_size);
        &binned[..]
    } else {
        sequence
    };
    driver::run(RunInput {
        requests,
        core: job.core.clone(),
        latency: ctx.latency,
        seed: ctx.seed,
        sla_ns: ctx.sla_ns,
        window_ns: ctx.window_ns,
        closed: job.closed,
        lora: job.lora,
    })
}

/// The one-big-cache reference of a routed run and the unbounded ideal: every request, in
/// arrival order, looked up in one LRU cache with the cluster's whole KV capacity (N x per
/// replica), its blocks cached the moment it arrives ([`super::reuse::bounded_prefix_reuse`]),
/// and the same without a bound ([`super::reuse::ideal_prefix_reuse`]). The first is what one
/// shared cache of the cluster's memory would hit; it never misses a prefix because the
/// request holding it is still computing it, but LRU is not optimal, so N caches that each
/// keep their own conversations can beat it a little (they do not evict one conversation
/// for another's). The second is a strict bound. (One replica with N times the KV and slots
/// run through the scheduler is neither: with one replica's step budget it runs N times
/// slower, so more requests arrive while the turn they extend is still prefilling.)
fn reference(input: &ContinuousInput<'_>) -> (PrefixStats, PrefixStats) {
    let c = &input.sched;
    if !c.prefix_caching {
        return Default::default();
    }
    let capacity_blocks =
        c.kv_capacity_tokens.saturating_mul(c.replicas as u64) / u64::from(c.block_tokens);
    (
        super::reuse::bounded_prefix_reuse(
            input.requests,
            input.prefix,
            c.block_tokens,
            capacity_blocks,
        ),
        super::reuse::ideal_prefix_reuse(input.requests, input.prefix, c.block_tokens),
    )
}

/// Runs every job on up to `threads` threads (0: available parallelism); results in job order.
fn execute(ctx: &RunContext<'_>, jobs: &[Job], threads: usize) -> Result<Vec<RunOutput>, SimError> {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    }
    .min(jobs.len())
    .max(1);
    if threads == 1 {
        return jobs.iter().map(|j| run_one(ctx, j)).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<RunOutput, SimError>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                // Relaxed: the counter only hands out distinct indices; results are joined
                // by the scope before they are read.
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let out = run_one(ctx, job);
                *results[i].lock().expect("no run panics while holding it") = Some(out);
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .expect("no run panics while holding it")
                .expect("every job ran")
        })
        .collect()
}
