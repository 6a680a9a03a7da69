//! The live report: what `abe loadgen` prints and writes with `--json`.
//!
//! Its `runs` entry is a [`RunReport`], built by the simulator's own [`RunReport::new`] from
//! a simulator `Recorder` filled with wall-clock measurements, so a simulated and a live run of one
//! scenario have the same fields computed the same way (throughput = completed / makespan,
//! first scheduled send to last response byte; latency from the scheduled send; SLA
//! attainment over requests offered). Fields only the server can see (batches, queue wait,
//! worker utilisation, flush reasons, memory-limit hits) are 0 in a live run. What only a
//! live run has (late sends, send lag, errors by status, wall time) is under `live`.
//!
//! Unlike the simulator's report this one is not deterministic: it measures a real server.
//! Nothing here prints; [`LiveReport::write_json`] is the only file-system access.

use super::client::TransportError;
use super::error::LoadgenError;
use crate::sim::report::RunReport;
use crate::sim::table::{format_table, priority_table, run_rows, RunColumn};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Send lag (actual send minus scheduled send), ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LagSummary {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Measurements only a live run has.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveStats {
    /// Requests written to a connection (or attempted: connect failures count).
    pub sent: u64,
    /// Of `sent`: sent more than `late_threshold_ms` after their scheduled time (every
    /// connection was busy, or the generator could not keep up). Their latency still counts
    /// from the schedule.
    pub late_sends: u64,
    pub late_threshold_ms: f64,
    pub send_lag_ms: LagSummary,
    /// Requests not answered 2xx, by HTTP status (`"429"`) or transport failure
    /// (`"connect"`, `"timeout"`, `"closed_before_response"`, `"closed_mid_response"`,
    /// `"io"`, `"malformed"`, `"too_large"`: `TransportError::explain` says what each means).
    pub errors_by_status: BTreeMap<String, u64>,
    /// Keep-alive connections the server closed while they sat idle (its keep-alive
    /// timeout shorter than a gap between their requests), replaced by fresh ones before
    /// the request went out, or by its one retry. Not failures: every such request was
    /// sent and answered (or failed for another reason, counted above).
    pub reopened_connections: u64,
    /// Offered load: requests / (last scheduled send - first), requests/s (0 for one request
    /// or a saturated burst).
    pub offered_rps: f64,
    /// Wall time from the start of the schedule to the last answer, s.
    pub wall_s: f64,
}

/// A closed loop's shape (see `run`): how many clients and how long each thinks.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ClosedLoopSummary {
    pub clients: usize,
    pub think_ms: f64,
    pub think_jitter: f64,
}

/// A whole live run. Shared fields have the names and meanings of the simulator's
/// `SimReport`, so `jq .runs[0].throughput_rps` reads either file.
#[derive(Clone, Debug, Serialize)]
pub struct LiveReport {
    pub scenario: String,
    pub description: String,
    pub seed: u64,
    pub requests: u64,
    /// Fingerprint of the request sequence (equal to `abe simulate`'s for the same scenario,
    /// seed and request count).
    pub request_digest: String,
    pub sla_ms: f64,
    pub target: String,
    pub connections: usize,
    pub rate_scale: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Set for a closed loop (then `rate_scale` does not apply, latency counts from the
    /// actual send, and `live.offered_rps` is 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closed_loop: Option<ClosedLoopSummary>,
    /// The strategy the target reported or was switched to (`unknown` if it would not say).
    pub strategies: Vec<String>,
    /// One entry: this run, as the simulator reports each of its runs.
    pub runs: Vec<RunReport>,
    pub live: LiveStats,
}

/// The simulator's columns that a client can measure; `late` follows them.
const TABLE_COLUMNS: [RunColumn; 11] = [
    RunColumn::Run,
    RunColumn::Completed,
    RunColumn::Rejected,
    RunColumn::Failed,
    RunColumn::ThroughputRps,
    RunColumn::OutputTokensPerS,
    RunColumn::P50Ms,
    RunColumn::P90Ms,
    RunColumn::P99Ms,
    RunColumn::P99_9Ms,
    RunColumn::SlaPercent,
];

impl LiveReport {
    /// The run (there is exactly one).
    pub fn run(&self) -> &RunReport {
        &self.runs[0]
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("the report serialises");
        s.push('\n');
        s
    }

    /// Writes [`LiveReport::to_json`] to `path`, creating its folder.
    pub fn write_json(&self, path: &Path) -> Result<(), LoadgenError> {
        let io = |source| LoadgenError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(path, self.to_json()).map_err(io)
    }

    /// The human table: the simulator's columns that a client can measure, then the live
    /// ones.
    pub fn table(&self) -> String {
        let r = self.run();
        let live = &self.live;
        let mut t = String::new();
        let load = match &self.closed_loop {
            None => format!(
                "rate x{} | {} connections",
                self.rate_scale, self.connections
            ),
            Some(c) => format!(
                "closed loop: {} clients, think {} ms",
                c.clients, c.think_ms
            ),
        };
        let _ = writeln!(
            t,
            "live {} | scenario {} | seed {} | {} requests | {} | SLA {} ms | digest {}",
            self.target,
            self.scenario,
            self.seed,
            self.requests,
            load,
            self.sla_ms,
            self.request_digest
        );
        let (mut header, mut rows) = run_rows(&TABLE_COLUMNS, &self.runs);
        header.push("late");
        for row in &mut rows {
            row.push(live.late_sends.to_string());
        }
        t.push_str(&format_table(&header, &rows));
        if let Some(p) = priority_table(&self.runs) {
            t.push_str(&p);
        }
        let _ = writeln!(
            t,
            "offered {:.2} req/s | makespan {:.2} s | send lag p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms | {} of {} sent > {} ms late",
            live.offered_rps,
            r.makespan_s,
            live.send_lag_ms.p50,
            live.send_lag_ms.p99,
            live.send_lag_ms.max,
            live.late_sends,
            live.sent,
            live.late_threshold_ms
        );
        if live.errors_by_status.is_empty() {
            t.push_str("errors: none\n");
        } else {
            let list: Vec<String> = live
                .errors_by_status
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            let _ = writeln!(t, "errors: {}", list.join(", "));
            for kind in TransportError::ALL {
                if live.errors_by_status.contains_key(kind.as_str()) {
                    let _ = writeln!(t, "  {}: {}", kind.as_str(), kind.explain());
                }
            }
        }
        if live.reopened_connections > 0 {
            let _ = writeln!(
                t,
                "keep-alive connections closed by the server while idle, reopened before a send: {}",
                live.reopened_connections
            );
        }
        t
    }
}
