//! SVG charts of a simulation report (plotters, SVG backend only, no fonts loaded: text is
//! left to the viewer): latency and queue depth over time, batch-size distribution, and
//! throughput and latency (p50, p99) against the first sweep key; for continuous runs TTFT,
//! TPOT and ITL bars, and TTFT and TPOT against the first sweep key; for routed runs each
//! replica's busy share and hit rate.
//!
//! Every chart is a pure function of the report, so the same report draws the same bytes.
//! Nothing here runs a simulation; the only I/O is writing the named file.

use super::report::{ContinuousMetrics, LatencySummary, RunReport, SimReport};
use super::series::WindowRow;
use super::SimError;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Line colours, cycled per run.
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

const SIZE: (u32, u32) = (1000, 600);

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> SimError {
    SimError::Plot {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

/// Upper axis bound with 5 % headroom (at least `floor`).
fn top(max: f64, floor: f64) -> f64 {
    if max.is_finite() && max > 0.0 {
        max * 1.05
    } else {
        floor
    }
}

/// One line per run of `y(row)` over window start time (rows where `keep` holds).
fn time_chart(
    report: &SimReport,
    path: &Path,
    title: &str,
    y_label: &str,
    y: impl Fn(&WindowRow) -> f64,
    keep: impl Fn(&WindowRow) -> bool,
) -> Result<(), SimError> {
    let lines: Vec<Vec<(f64, f64)>> = report
        .series
        .iter()
        .map(|s| {
            s.rows()
                .filter(|r| keep(r))
                .map(|r| (r.start_s, y(&r)))
                .collect()
        })
        .collect();
    let x_max = lines.iter().flatten().map(|p| p.0).fold(0.0, f64::max);
    let y_max = lines.iter().flatten().map(|p| p.1).fold(0.0, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..top(x_max, 1.0), 0.0..top(y_max, 1.0))
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("virtual time (s)")
        .y_desc(y_label)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (i, (line, run)) in lines.into_iter().zip(&report.runs).enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(line, c.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?
            .label(run.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Grouped bars: share of batches of each size, one colour per run.
fn batch_size_chart(report: &SimReport, path: &Path) -> Result<(), SimError> {
    let max_size = report
        .runs
        .iter()
        .flat_map(|r| r.batch_sizes.iter().map(|b| b[0]))
        .max()
        .unwrap_or(1) as f64;
    let shares: Vec<Vec<(f64, f64)>> = report
        .runs
        .iter()
        .map(|r| {
            let total = r.batches.max(1) as f64;
            r.batch_sizes
                .iter()
                .map(|b| (b[0] as f64, b[1] as f64 / total))
                .collect()
        })
        .collect();
    let y_max = shares.iter().flatten().map(|p| p.1).fold(0.0, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Batch size distribution", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_size + 1.0, 0.0..top(y_max, 1.0))
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("requests per batch")
        .y_desc("share of batches")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let runs = report.runs.len().max(1) as f64;
    let width = 0.8 / runs;
    for (i, (bars, run)) in shares.into_iter().zip(&report.runs).enumerate() {
        let c = colour(i);
        let offset = -0.4 + i as f64 * width;
        chart
            .draw_series(bars.into_iter().map(move |(size, share)| {
                Rectangle::new(
                    [(size + offset, 0.0), (size + offset + width, share)],
                    c.filled(),
                )
            }))
            .map_err(|e| plot_err(path, e))?
            .label(run.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Routed runs: each replica's busy share (bars, one colour per run) and hit rate (a dot
/// above each bar at the same scale, 0..1), x = replica index: load balance and cache
/// affinity side by side.
fn cluster_chart(report: &SimReport, path: &Path) -> Result<(), SimError> {
    let runs: Vec<&RunReport> = report.runs.iter().filter(|r| r.cluster.is_some()).collect();
    let replicas = runs
        .iter()
        .filter_map(|r| r.cluster.as_ref())
        .map(|c| c.replicas.len())
        .max()
        .unwrap_or(1) as f64;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Replicas: busy share (bars) and prefix-cache hit rate (dots)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..replicas - 0.5, 0.0..1.05)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("replica")
        .y_desc("busy share / hit rate")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let width = 0.8 / runs.len().max(1) as f64;
    for (i, run) in runs.iter().enumerate() {
        let Some(c) = &run.cluster else { continue };
        let col = colour(i);
        let offset = -0.4 + i as f64 * width;
        let label = format!(
            "{} (hit {:.1} % of ref {:.1} %, imbalance {:.2})",
            run.label,
            c.hit_rate * 100.0,
            c.reference_hit_rate * 100.0,
            c.imbalance
        );
        chart
            .draw_series(c.replicas.iter().enumerate().map(move |(k, r)| {
                let x = k as f64 + offset;
                Rectangle::new([(x, 0.0), (x + width, r.busy_fraction)], col.filled())
            }))
            .map_err(|e| plot_err(path, e))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
        chart
            .draw_series(c.replicas.iter().enumerate().map(move |(k, r)| {
                let x = k as f64 + offset + width / 2.0;
                Circle::new((x, r.hit_rate), 3, BLACK.filled())
            }))
            .map_err(|e| plot_err(path, e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// One line per strategy and combination of the other sweep keys: `y(run)` against `key`.
fn sweep_lines(
    report: &SimReport,
    key: &str,
    y: impl Fn(&RunReport) -> f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in &report.runs {
        let x = r
            .params
            .iter()
            .find(|p| p.key == key)
            .map_or(0.0, |p| p.value);
        let name = sweep_line_name(r, key);
        match lines.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push((x, y(r))),
            None => lines.push((name, vec![(x, y(r))])),
        }
    }
    lines
}

/// Which token latency of a continuous run a chart draws.
type TokenSummary = fn(&ContinuousMetrics) -> LatencySummary;

/// A sweep line's name: the run's strategy and its other sweep keys.
fn sweep_line_name(r: &RunReport, key: &str) -> String {
    std::iter::once(r.strategy.clone())
        .chain(
            r.params
                .iter()
                .filter(|p| p.key != key)
                .map(|p| format!("{}={}", p.key, p.value)),
        )
        .collect::<Vec<_>>()
        .join(" ")
}

/// Grouped bars of the continuous runs' TTFT, TPOT and ITL (p50 and p99), ms.
fn token_latency_chart(report: &SimReport, path: &Path) -> Result<(), SimError> {
    let runs: Vec<(&str, &ContinuousMetrics)> = report
        .runs
        .iter()
        .filter_map(|r| r.continuous.as_ref().map(|c| (r.label.as_str(), c)))
        .collect();
    let groups = |c: &ContinuousMetrics| {
        [
            c.ttft_ms.p50,
            c.ttft_ms.p99,
            c.tpot_ms.p50,
            c.tpot_ms.p99,
            c.itl_ms.p50,
            c.itl_ms.p99,
        ]
    };
    let y_max = runs.iter().flat_map(|(_, c)| groups(c)).fold(0.0, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "TTFT, TPOT, ITL: p50 and p99 (groups 0-5: TTFT p50, p99, TPOT p50, p99, ITL p50, p99)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..5.5, 0.0..top(y_max, 1.0))
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("TTFT p50, TTFT p99, TPOT p50, TPOT p99, ITL p50, ITL p99")
        .y_desc("ms")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    let width = 0.8 / runs.len().max(1) as f64;
    for (i, (label, c)) in runs.iter().enumerate() {
        let colour = colour(i);
        let offset = -0.4 + i as f64 * width;
        let bars = groups(c);
        chart
            .draw_series(bars.into_iter().enumerate().map(move |(g, v)| {
                let x = g as f64 + offset;
                Rectangle::new([(x, 0.0), (x + width, v)], colour.filled())
            }))
            .map_err(|e| plot_err(path, e))?
            .label(label.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// p99 (thick) and p50 (thin) end-to-end latency against the first sweep key, one colour
/// per strategy and combination of the other keys: latency against load for `rate_scale`.
fn sweep_latency_chart(report: &SimReport, path: &Path, key: &str) -> Result<(), SimError> {
    sweep_percentile_chart(
        report,
        path,
        key,
        "Latency",
        "end-to-end latency (ms)",
        |r| Some(r.latency_ms),
    )
}

/// p99 (thick) and p50 (thin) of `of(run)` against the sweep key `key`, for the runs that
/// have it (TTFT and TPOT exist for continuous runs only).
fn sweep_percentile_chart(
    report: &SimReport,
    path: &Path,
    key: &str,
    what: &str,
    y_desc: &str,
    of: impl Fn(&RunReport) -> Option<LatencySummary>,
) -> Result<(), SimError> {
    let keep: Vec<RunReport> = report
        .runs
        .iter()
        .filter(|r| of(r).is_some())
        .cloned()
        .collect();
    let lines = |p: fn(&LatencySummary) -> f64| {
        let mut lines = Vec::new();
        for r in &keep {
            let x = r
                .params
                .iter()
                .find(|q| q.key == key)
                .map_or(0.0, |q| q.value);
            let name = sweep_line_name(r, key);
            let y = of(r).map_or(0.0, |s| p(&s));
            match lines
                .iter_mut()
                .find(|(n, _): &&mut (String, Vec<(f64, f64)>)| *n == name)
            {
                Some((_, pts)) => pts.push((x, y)),
                None => lines.push((name, vec![(x, y)])),
            }
        }
        lines
    };
    let p50 = lines(|s| s.p50);
    let p99 = lines(|s| s.p99);
    let all = || p50.iter().chain(&p99).flat_map(|l| &l.1);
    let x_min = all().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = all().map(|p| p.0).fold(0.0, f64::max);
    let y_max = all().map(|p| p.1).fold(0.0, f64::max);
    let pad = if x_max > x_min {
        (x_max - x_min) * 0.05
    } else {
        0.5
    };
    let x_lo = if x_min.is_finite() {
        (x_min - pad).max(0.0)
    } else {
        0.0
    };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{what} p50 (thin) and p99 (thick) vs {key}"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo..x_max + pad, 0.0..top(y_max, 1.0))
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(key)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (i, ((name, lo), (_, hi))) in p50.into_iter().zip(p99).enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(hi, c.stroke_width(3)).point_size(4))
            .map_err(|e| plot_err(path, e))?
            .label(format!("{name} p99"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        chart
            .draw_series(LineSeries::new(lo, c.stroke_width(1)).point_size(2))
            .map_err(|e| plot_err(path, e))?
            .label(format!("{name} p50"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Throughput against the first sweep key: one line per strategy and combination of the
/// other keys.
fn sweep_chart(report: &SimReport, path: &Path, key: &str) -> Result<(), SimError> {
    let lines = sweep_lines(report, key, |r| r.throughput_rps);
    let x_min = lines
        .iter()
        .flat_map(|l| &l.1)
        .map(|p| p.0)
        .fold(f64::INFINITY, f64::min);
    let x_max = lines
        .iter()
        .flat_map(|l| &l.1)
        .map(|p| p.0)
        .fold(0.0, f64::max);
    let y_max = lines
        .iter()
        .flat_map(|l| &l.1)
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let x_lo = if x_min.is_finite() {
        (x_min - 0.5).max(0.0)
    } else {
        0.0
    };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("Throughput vs {key}"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo..x_max + 0.5, 0.0..top(y_max, 1.0))
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(key)
        .y_desc("throughput (requests/s)")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (i, (name, pts)) in lines.into_iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)).point_size(4))
            .map_err(|e| plot_err(path, e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// Draws every chart into `dir` (created if missing); returns the files written.
pub fn write_charts(report: &SimReport, dir: &Path) -> Result<Vec<PathBuf>, SimError> {
    std::fs::create_dir_all(dir).map_err(|source| SimError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    let p = dir.join("latency_over_time.svg");
    time_chart(
        report,
        &p,
        "Mean end-to-end latency per window",
        "latency (ms)",
        |r| r.mean_latency_ms,
        |r| r.completed > 0,
    )?;
    written.push(p);
    let p = dir.join("queue_depth_over_time.svg");
    time_chart(
        report,
        &p,
        "Mean queue depth per window",
        "queued requests",
        |r| r.queue_depth_mean,
        |_| true,
    )?;
    written.push(p);
    let p = dir.join("batch_size_distribution.svg");
    batch_size_chart(report, &p)?;
    written.push(p);
    if let Some(axis) = report.sweep.first() {
        let p = dir.join(format!("throughput_vs_{}.svg", axis.key));
        sweep_chart(report, &p, &axis.key)?;
        written.push(p);
        let p = dir.join(format!("latency_vs_{}.svg", axis.key));
        sweep_latency_chart(report, &p, &axis.key)?;
        written.push(p);
    }
    if report.runs.iter().any(|r| r.cluster.is_some()) {
        let p = dir.join("cluster_replicas.svg");
        cluster_chart(report, &p)?;
        written.push(p);
    }
    if report.runs.iter().any(|r| r.continuous.is_some()) {
        let p = dir.join("token_latency.svg");
        token_latency_chart(report, &p)?;
        written.push(p);
        if let Some(axis) = report.sweep.first() {
            let charts: [(&str, &str, TokenSummary); 2] = [
                ("ttft", "time to first token (ms)", |c| c.ttft_ms),
                ("tpot", "time per output token (ms)", |c| c.tpot_ms),
            ];
            for (name, y_desc, of) in charts {
                let p = dir.join(format!("{name}_vs_{}.svg", axis.key));
                sweep_percentile_chart(report, &p, &axis.key, &name.to_uppercase(), y_desc, |r| {
                    r.continuous.as_ref().map(of)
                })?;
                written.push(p);
            }
        }
    }
    Ok(written)
}
