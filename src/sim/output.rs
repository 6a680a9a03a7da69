//! Writing a report: JSON (`--json`), CSV time series (`--csv`) and SVG charts (`--svg`).
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
    }
    if let Some(dir) = &paths.svg_dir {
        written.extend(plot::write_charts(report, dir)?);
    }
    Ok(written)
}
