//! The run table that `abe simulate` and `abe loadgen` print: its columns, each cell written
//! from a [`RunReport`] in one place, the plain-text layout, and the simulator's table
//! ([`SimReport::table`]; the load generator's is `LiveReport::table`).
//!
//! Each report picks its columns from [`RunColumn`] (the load generator leaves out what only
//! the server can see and adds its own), so a column reads the same in both. Nothing here
//! may depend on anything but the report: the simulator's table is byte-identical for a seed.

use super::report::{RunReport, SimReport};
use std::fmt::Write as _;

/// One column of the run table: its header and how a run's cell is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunColumn {
    /// The run's label: strategy and sweep point.
    Run,
    Completed,
    /// Refused at admission because the queue was full.
    Rejected,
    /// KV-memory limit hits.
    MemoryHits,
    Failed,
    ThroughputRps,
    OutputTokensPerS,
    P50Ms,
    P90Ms,
    P99Ms,
    P99_9Ms,
    /// Mean queue wait.
    WaitMs,
    /// SLA attainment.
    SlaPercent,
    /// Mean batch size.
    Batch,
    /// Worker utilisation.
    UtilisationPercent,
}

impl RunColumn {
    /// The column's header.
    pub const fn header(self) -> &'static str {
        match self {
            RunColumn::Run => "run",
            RunColumn::Completed => "completed",
            RunColumn::Rejected => "rejected",
            RunColumn::MemoryHits => "mem hits",
            RunColumn::Failed => "failed",
            RunColumn::ThroughputRps => "req/s",
            RunColumn::OutputTokensPerS => "out tok/s",
            RunColumn::P50Ms => "p50 ms",
            RunColumn::P90Ms => "p90 ms",
            RunColumn::P99Ms => "p99 ms",
            RunColumn::P99_9Ms => "p99.9 ms",
            RunColumn::WaitMs => "wait ms",
            RunColumn::SlaPercent => "SLA %",
            RunColumn::Batch => "batch",
            RunColumn::UtilisationPercent => "util %",
        }
    }

    /// The cell of run `r` in this column.
    pub fn cell(self, r: &RunReport) -> String {
        let l = &r.latency_ms;
        match self {
            RunColumn::Run => r.label.clone(),
            RunColumn::Completed => r.completed.to_string(),
            RunColumn::Rejected => r.rejected_queue_full.to_string(),
            RunColumn::MemoryHits => r.memory_limit_hits.to_string(),
            RunColumn::Failed => r.failed.to_string(),
            RunColumn::ThroughputRps => format!("{:.2}", r.throughput_rps),
            RunColumn::OutputTokensPerS => format!("{:.1}", r.output_tokens_per_s),
            RunColumn::P50Ms => format!("{:.1}", l.p50),
            RunColumn::P90Ms => format!("{:.1}", l.p90),
            RunColumn::P99Ms => format!("{:.1}", l.p99),
            RunColumn::P99_9Ms => format!("{:.1}", l.p99_9),
            RunColumn::WaitMs => format!("{:.1}", r.queue_wait_ms_mean),
            RunColumn::SlaPercent => format!("{:.1}", r.sla_attainment * 100.0),
            RunColumn::Batch => format!("{:.2}", r.mean_batch_size),
            RunColumn::UtilisationPercent => format!("{:.1}", r.worker_utilisation * 100.0),
        }
    }
}

/// The columns of the simulator's table.
const SIM_COLUMNS: [RunColumn; 15] = [
    RunColumn::Run,
    RunColumn::Completed,
    RunColumn::Rejected,
    RunColumn::MemoryHits,
    RunColumn::Failed,
    RunColumn::ThroughputRps,
    RunColumn::OutputTokensPerS,
    RunColumn::P50Ms,
    RunColumn::P90Ms,
    RunColumn::P99Ms,
    RunColumn::P99_9Ms,
    RunColumn::WaitMs,
    RunColumn::SlaPercent,
    RunColumn::Batch,
    RunColumn::UtilisationPercent,
];

impl SimReport {
    /// The human table printed on stdout.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "scenario {} | seed {} | {} requests | latency model {} | SLA {} ms",
            self.scenario,
            self.seed,
            self.requests,
            self.latency.name(),
            self.sla_ms
        );
        let (header, rows) = run_rows(&SIM_COLUMNS, &self.runs);
        t.push_str(&format_table(&header, &rows));
        if let Some(p) = priority_table(&self.runs) {
            t.push_str(&p);
        }
        if let Some(c) = token_table(&self.runs) {
            t.push_str(&c);
        }
        if let Some(c) = cluster_table(&self.runs) {
            t.push_str(&c);
        }
        t
    }
}

/// Continuous runs' token metrics (TTFT, TPOT and ITL in ms, goodput, tokens per step, KV
/// and slot use, preemptions), one row per continuous run; `None` when there is none.
pub fn token_table(runs: &[RunReport]) -> Option<String> {
    // The prefix cache's hit rate, when any run cached prefixes.
    let caching = runs.iter().any(|r| {
        r.continuous
            .as_ref()
            .is_some_and(|c| c.prefix_cache.is_some())
    });
    let mut header = vec![
        "continuous batching",
        "ttft p50",
        "ttft p99",
        "tpot p50",
        "tpot p99",
        "itl p50",
        "itl p99",
        "goodput %",
        "tok/step",
        "kv %",
        "slots %",
        "preempt",
    ];
    if caching {
        header.push("hit %");
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .filter_map(|r| {
            let c = r.continuous.as_ref()?;
            let mut row = vec![
                r.label.clone(),
                format!("{:.1}", c.ttft_ms.p50),
                format!("{:.1}", c.ttft_ms.p99),
                format!("{:.2}", c.tpot_ms.p50),
                format!("{:.2}", c.tpot_ms.p99),
                format!("{:.2}", c.itl_ms.p50),
                format!("{:.2}", c.itl_ms.p99),
                format!("{:.1}", c.goodput_fraction * 100.0),
                format!("{:.1}", c.mean_tokens_per_step),
                format!("{:.1}", c.kv_utilisation_mean * 100.0),
                format!("{:.1}", c.slot_occupancy_mean * 100.0),
                c.preemptions.to_string(),
            ];
            if caching {
                row.push(c.prefix_cache.map_or_else(
                    || "off".to_string(),
                    |p| format!("{:.1}", p.hit_rate * 100.0),
                ));
            }
            Some(row)
        })
        .collect();
    (!rows.is_empty()).then(|| format_table(&header, &rows))
}

/// Routed runs' clusters: hit rate, the one-big-cache reference and the share of it
/// reached, TTFT mean and p99, throughput, load imbalance and the replicas' busy range, one
/// row per routed run; `None` when no run was routed.
pub fn cluster_table(runs: &[RunReport]) -> Option<String> {
    let header = [
        "cluster",
        "routing",
        "replicas",
        "hit %",
        "ref hit %",
        "of ref %",
        "ttft mean",
        "ttft p99",
        "req/s",
        "imbalance",
        "busy % min",
        "busy % max",
    ];
    let rows: Vec<Vec<String>> = runs
        .iter()
        .filter_map(|r| {
            let c = r.cluster.as_ref()?;
            let ttft = r.continuous.as_ref().map(|m| m.ttft_ms).unwrap_or_default();
            let busy = c.replicas.iter().map(|x| x.busy_fraction * 100.0);
            let min = busy.clone().fold(f64::INFINITY, f64::min);
            let max = busy.fold(0.0, f64::max);
            Some(vec![
                r.label.clone(),
                c.routing.clone(),
                c.replicas.len().to_string(),
                format!("{:.1}", c.hit_rate * 100.0),
                format!("{:.1}", c.reference_hit_rate * 100.0),
                format!("{:.1}", c.hit_rate_of_reference * 100.0),
                format!("{:.1}", ttft.mean),
                format!("{:.1}", ttft.p99),
                format!("{:.2}", r.throughput_rps),
                format!("{:.3}", c.imbalance),
                format!("{min:.1}"),
                format!("{max:.1}"),
            ])
        })
        .collect();
    (!rows.is_empty()).then(|| format_table(&header, &rows))
}

/// End-to-end latency per priority class, highest first (`critical p50`, `critical p99`,
/// ... in ms, and each class's failures), one row per run; `None` when every run offered a
/// single class (the run table already says it all).
pub fn priority_table(runs: &[RunReport]) -> Option<String> {
    let mut classes: Vec<&str> = Vec::new();
    for c in runs.iter().flat_map(|r| &r.latency_ms_by_priority) {
        if !classes.contains(&c.priority.as_str()) {
            classes.push(&c.priority);
        }
    }
    if classes.len() < 2 {
        return None;
    }
    // Highest first, whatever order the runs listed them in.
    let rank = |p: &str| match p {
        "critical" => 0,
        "high" => 1,
        "normal" => 2,
        _ => 3,
    };
    classes.sort_by_key(|p| rank(p));
    let headers: Vec<String> = classes
        .iter()
        .flat_map(|p| {
            [
                format!("{p} p50"),
                format!("{p} p99"),
                format!("{p} failed"),
            ]
        })
        .collect();
    let mut header: Vec<&str> = vec!["latency by priority (ms)"];
    header.extend(headers.iter().map(String::as_str));
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let mut row = vec![r.label.clone()];
            for p in &classes {
                match r.latency_ms_by_priority.iter().find(|c| c.priority == *p) {
                    Some(c) => row.extend([
                        format!("{:.1}", c.p50),
                        format!("{:.1}", c.p99),
                        c.failed.to_string(),
                    ]),
                    None => row.extend(["-".to_string(), "-".to_string(), "-".to_string()]),
                }
            }
            row
        })
        .collect();
    Some(format_table(&header, &rows))
}

/// The headers of `columns`, and one row of cells per run.
pub fn run_rows(
    columns: &[RunColumn],
    runs: &[RunReport],
) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = columns.iter().map(|c| c.header()).collect();
    let rows = runs
        .iter()
        .map(|r| columns.iter().map(|c| c.cell(r)).collect())
        .collect();
    (header, rows)
}

/// A plain-text table: each column as wide as its widest cell, the first column
/// left-aligned, the others right-aligned, two spaces between columns.
pub fn format_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|row| row[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        for (c, cell) in cells.enumerate() {
            if c == 0 {
                let _ = write!(out, "{cell:<w$}", w = widths[0]);
            } else {
                let _ = write!(out, "  {cell:>w$}", w = widths[c]);
            }
        }
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}
