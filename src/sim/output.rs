//! Writing a report: JSON (`--json`), CSV time series (`--csv`; with more than one
//! priority class also `NAME.by_priority.csv`, latency per class; with continuous runs also
//! `NAME.continuous.csv`, their token metrics) and SVG charts (`--svg`).
//!
//! The text of each file is a pure function of the report (see [`super::report`] for why
//! that makes it byte-identical across runs); only the final write touches the file system.
//! Nothing here prints.

use super::plot;
use super::report::SimReport;
use super::SimError;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where to write what; `None` skips that output.
#[derive(Clone, Debug, Default)]
pub struct OutputPaths {
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub svg_dir: Option<PathBuf>,
}

/// The CSV time series: one row per (run, window), runs in report order. Columns: `run`,
/// `strategy`, one per sweep key, `window_start_s`, `completed`, `mean_latency_ms`,
/// `queue_depth_mean`, `batches`, `mean_batch_size`, `failed`.
pub fn csv(report: &SimReport) -> String {
    let mut out = String::from("run,strategy");
    for axis in &report.sweep {
        out.push(',');
        out.push_str(&axis.key);
    }
    out.push_str(
        ",window_start_s,completed,mean_latency_ms,queue_depth_mean,batches,mean_batch_size,failed\n",
    );
    for (i, (run, series)) in report.runs.iter().zip(&report.series).enumerate() {
        let mut prefix = format!("{i},{}", run.strategy);
        for p in &run.params {
            let _ = write!(prefix, ",{}", p.value);
        }
        for r in series.rows() {
            let _ = writeln!(
                out,
                "{prefix},{},{},{},{},{},{},{}",
                r.start_s,
                r.completed,
                r.mean_latency_ms,
                r.queue_depth_mean,
                r.batches,
                r.mean_batch_size,
                r.failed
            );
        }
    }
    out
}

/// Latency per priority class: one row per (run, class offered), runs in report order,
/// classes highest first. Columns: `run`, `strategy`, one per sweep key, `priority`,
/// `offered`, `completed`, `failed`, `mean_ms`, `p50_ms`, `p99_ms`.
pub fn priority_csv(report: &SimReport) -> String {
    let mut out = String::from("run,strategy");
    for axis in &report.sweep {
        out.push(',');
        out.push_str(&axis.key);
    }
    out.push_str(",priority,offered,completed,failed,mean_ms,p50_ms,p99_ms\n");
    for (i, run) in report.runs.iter().enumerate() {
        let mut prefix = format!("{i},{}", run.strategy);
        for p in &run.params {
            let _ = write!(prefix, ",{}", p.value);
        }
        for c in &run.latency_ms_by_priority {
            let _ = writeln!(
                out,
                "{prefix},{},{},{},{},{},{},{}",
                c.priority, c.offered, c.completed, c.failed, c.mean, c.p50, c.p99
            );
        }
    }
    out
}

/// Continuous runs' token metrics: one row per continuous run, in report order. Columns:
/// `run`, `label`, one per sweep key, then TTFT, TPOT and ITL (mean, p50, p90, p99 ms),
/// goodput, steps, tokens per step, preemptions, KV and slot use.
pub fn continuous_csv(report: &SimReport) -> String {
    // Prefix-cache columns when any run cached prefixes (empty cells for runs that did not).
    let caching = report.runs.iter().any(|r| {
        r.continuous
            .as_ref()
            .is_some_and(|c| c.prefix_cache.is_some())
    });
    let mut out = String::from("run,label");
    for axis in &report.sweep {
        out.push(',');
        out.push_str(&axis.key);
    }
    for m in ["ttft", "tpot", "itl"] {
        for q in ["mean", "p50", "p90", "p99"] {
            let _ = write!(out, ",{m}_{q}_ms");
        }
    }
    out.push_str(
        ",goodput_rps,goodput_fraction,steps,mean_tokens_per_step,preemptions,\
         kv_capacity_tokens,kv_utilisation_mean,kv_peak_tokens,slots_total,slot_occupancy_mean",
    );
    if caching {
        out.push_str(
            ",prefix_query_tokens,prefix_hit_tokens,prefix_hit_rate,prefix_evicted_blocks",
        );
    }
    out.push('\n');
    for (i, run) in report.runs.iter().enumerate() {
        let Some(c) = &run.continuous else { continue };
        let _ = write!(out, "{i},{}", run.label);
        for p in &run.params {
            let _ = write!(out, ",{}", p.value);
        }
        for s in [c.ttft_ms, c.tpot_ms, c.itl_ms] {
            let _ = write!(out, ",{},{},{},{}", s.mean, s.p50, s.p90, s.p99);
        }
        let _ = write!(
            out,
            ",{},{},{},{},{},{},{},{},{},{}",
            c.goodput_rps,
            c.goodput_fraction,
            c.steps,
            c.mean_tokens_per_step,
            c.preemptions,
            c.kv_capacity_tokens,
            c.kv_utilisation_mean,
            c.kv_peak_tokens,
            c.slots_total,
            c.slot_occupancy_mean
        );
        if caching {
            match c.prefix_cache {
                Some(p) => {
                    let _ = write!(
                        out,
                        ",{},{},{},{}",
                        p.query_tokens, p.hit_tokens, p.hit_rate, p.evicted_blocks
                    );
                }
                None => out.push_str(",,,,"),
            }
        }
        out.push('\n');
    }
    out
}

/// Where [`continuous_csv`] goes: beside the time series, `NAME.csv` -> `NAME.continuous.csv`.
pub fn continuous_csv_path(csv: &Path) -> PathBuf {
    let stem = csv.file_stem().map_or_else(
        || "report".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    csv.with_file_name(format!("{stem}.continuous.csv"))
}

/// Routed runs' replicas: one row per (routed run, replica), in report order, then the
/// run's cluster figures repeated on each of its rows (so one file plots either). Columns:
/// `run`, `label`, `routing`, `replica`, `requests`, `busy_fraction`, `kv_use`,
/// `hit_rate`, then the cluster's `cluster_hit_rate`, `reference_hit_rate`,
/// `hit_rate_of_reference`, `imbalance`, `ttft_mean_ms`, `ttft_p99_ms`, `throughput_rps`.
pub fn cluster_csv(report: &SimReport) -> String {
    let mut out = String::from(
        "run,label,routing,replica,requests,busy_fraction,kv_use,hit_rate,cluster_hit_rate,\
         reference_hit_rate,hit_rate_of_reference,imbalance,ttft_mean_ms,ttft_p99_ms,\
         throughput_rps\n",
    );
    for (i, run) in report.runs.iter().enumerate() {
        let Some(c) = &run.cluster else { continue };
        let ttft = run
            .continuous
            .as_ref()
            .map(|m| m.ttft_ms)
            .unwrap_or_default();
        for (k, r) in c.replicas.iter().enumerate() {
            let _ = writeln!(
                out,
                "{i},{},{},{k},{},{},{},{},{},{},{},{},{},{},{}",
                run.label,
                c.routing,
                r.requests,
                r.busy_fraction,
                r.kv_use,
                r.hit_rate,
                c.hit_rate,
                c.reference_hit_rate,
                c.hit_rate_of_reference,
                c.imbalance,
                ttft.mean,
                ttft.p99,
                run.throughput_rps
            );
        }
    }
    out
}

/// Where [`cluster_csv`] goes: beside the time series, `NAME.csv` -> `NAME.cluster.csv`.
pub fn cluster_csv_path(csv: &Path) -> PathBuf {
    let stem = csv.file_stem().map_or_else(
        || "report".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    csv.with_file_name(format!("{stem}.cluster.csv"))
}

/// Where [`priority_csv`] goes: beside the time series, `NAME.csv` -> `NAME.by_priority.csv`.
pub fn priority_csv_path(csv: &Path) -> PathBuf {
    let stem = csv.file_stem().map_or_else(
        || "report".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    csv.with_file_name(format!("{stem}.by_priority.csv"))
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| SimError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes every requested output; returns the files written, in order.
pub fn write_outputs(report: &SimReport, paths: &OutputPaths) -> Result<Vec<PathBuf>, SimError> {
    let mut written = Vec::new();
    if let Some(p) = &paths.json {
        write(p, &report.to_json())?;
        written.push(p.clone());
    }
    if let Some(p) = &paths.csv {
        write(p, &csv(report))?;
        written.push(p.clone());
        let classes = report
            .runs
            .iter()
            .map(|r| r.latency_ms_by_priority.len())
            .max()
            .unwrap_or(0);
        if classes > 1 {
            let q = priority_csv_path(p);
            write(&q, &priority_csv(report))?;
            written.push(q);
        }
        if report.runs.iter().any(|r| r.continuous.is_some()) {
            let q = continuous_csv_path(p);
            write(&q, &continuous_csv(report))?;
            written.push(q);
        }
        if report.runs.iter().any(|r| r.cluster.is_some()) {
            let q = cluster_csv_path(p);
            write(&q, &cluster_csv(report))?;
            written.push(q);
        }
    }
    if let Some(dir) = &paths.svg_dir {
        written.extend(plot::write_charts(report, dir)?);
    }
    Ok(written)
}
