//! Per-window time series of one run, in virtual time: completions, latency, time-weighted
//! queue depth, batches dispatched.
//!
//! Windows are fixed-width (`window_ns`, 1 s by default) from t = 0 and created as virtual
//! time reaches them, so the vector grows with the makespan, never per request. A run whose
//! clock leaves `MAX_WINDOWS` behind (a far-future timeout) stops recording and says so in
//! `truncated` instead of growing without bound. Nothing here reads a clock.

/// Windows kept at most (at 1 s windows: 23 days of virtual time).
pub const MAX_WINDOWS: usize = 2_000_000;

/// Raw sums for one window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    /// Requests completed in the window.
    pub completed: u64,
    /// Sum of their end-to-end latencies, ns.
    pub latency_sum_ns: u128,
    /// Integral of queue depth over the window, request-ns.
    pub depth_area: u128,
    /// Batches dispatched in the window.
    pub batches: u64,
    /// Requests in those batches.
    pub batched: u64,
    /// Requests failed (timeouts) or refused (queue full) in the window.
    pub failed: u64,
}

/// A window with means computed, as written to CSV and plotted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowRow {
    pub start_s: f64,
    pub completed: u64,
    pub mean_latency_ms: f64,
    pub queue_depth_mean: f64,
    pub batches: u64,
    pub mean_batch_size: f64,
    pub failed: u64,
}

/// The series of one run.
#[derive(Clone, Debug)]
pub struct TimeSeries {
    window_ns: u64,
    windows: Vec<Window>,
    /// Virtual time up to which the depth integral is done.
    last_ns: u64,
    /// True when events fell past `MAX_WINDOWS` and were not recorded.
    pub truncated: bool,
}

impl TimeSeries {
    /// An empty series of `window_ns`-wide windows (at least 1 ns), with room reserved for
    /// `expected_ns` of virtual time.
    pub fn new(window_ns: u64, expected_ns: u64) -> Self {
        let window_ns = window_ns.max(1);
        let expect = (expected_ns / window_ns) as usize + 2;
        TimeSeries {
            window_ns,
            windows: Vec::with_capacity(expect.min(MAX_WINDOWS)),
            last_ns: 0,
            truncated: false,
        }
    }

    /// Window width, ns.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    fn window(&mut self, t_ns: u64) -> Option<&mut Window> {
        let i = (t_ns / self.window_ns) as usize;
        if i >= MAX_WINDOWS {
            self.truncated = true;
            return None;
        }
        if i >= self.windows.len() {
            self.windows.resize(i + 1, Window::default());
        }
        Some(&mut self.windows[i])
    }

    /// Integrates queue depth `depth` (constant since the last call) up to `now_ns`.
    pub fn advance(&mut self, now_ns: u64, depth: usize) {
        if depth == 0 {
            self.last_ns = self.last_ns.max(now_ns);
            return;
        }
        let mut t = self.last_ns;
        while t < now_ns {
            let end = ((t / self.window_ns).saturating_add(1))
                .saturating_mul(self.window_ns)
                .min(now_ns);
            let area = u128::from(end - t) * depth as u128;
            match self.window(t) {
                Some(w) => w.depth_area += area,
                None => break,
            }
            t = end;
        }
        self.last_ns = self.last_ns.max(now_ns);
    }

    /// A request completed at `now_ns` after `latency_ns`.
    pub fn on_complete(&mut self, now_ns: u64, latency_ns: u64) {
        if let Some(w) = self.window(now_ns) {
            w.completed += 1;
            w.latency_sum_ns += u128::from(latency_ns);
        }
    }

    /// A batch of `size` was dispatched at `now_ns`.
    pub fn on_dispatch(&mut self, now_ns: u64, size: usize) {
        if let Some(w) = self.window(now_ns) {
            w.batches += 1;
            w.batched += size as u64;
        }
    }

    /// A request failed or was refused at `now_ns`.
    pub fn on_fail(&mut self, now_ns: u64) {
        if let Some(w) = self.window(now_ns) {
            w.failed += 1;
        }
    }

    /// Raw windows.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Windows with means, in time order.
    pub fn rows(&self) -> impl Iterator<Item = WindowRow> + '_ {
        let width = self.window_ns as f64;
        self.windows
            .iter()
            .enumerate()
            .map(move |(i, w)| WindowRow {
                start_s: i as f64 * width / 1e9,
                completed: w.completed,
                mean_latency_ms: if w.completed == 0 {
                    0.0
                } else {
                    w.latency_sum_ns as f64 / w.completed as f64 / 1e6
                },
                queue_depth_mean: w.depth_area as f64 / width,
                batches: w.batches,
                mean_batch_size: if w.batches == 0 {
                    0.0
                } else {
                    w.batched as f64 / w.batches as f64
                },
                failed: w.failed,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_time_weighted_across_window_edges() {
        let s = 1_000_000_000;
        let mut ts = TimeSeries::new(s, 0);
        ts.advance(s / 2, 0); // empty until 0.5 s
        ts.advance(3 * s / 2, 4); // depth 4 from 0.5 s to 1.5 s
        ts.advance(2 * s, 2); // depth 2 from 1.5 s to 2 s
        ts.on_complete(2 * s + 1, 10_000_000);
        let rows: Vec<WindowRow> = ts.rows().collect();
        assert_eq!(rows.len(), 3);
        assert!((rows[0].queue_depth_mean - 2.0).abs() < 1e-12);
        assert!((rows[1].queue_depth_mean - 3.0).abs() < 1e-12);
        assert_eq!(rows[2].completed, 1);
        assert!((rows[2].mean_latency_ms - 10.0).abs() < 1e-12);
    }

    #[test]
    fn far_future_events_truncate_instead_of_growing() {
        let mut ts = TimeSeries::new(1, 0);
        ts.on_fail(u64::MAX / 2);
        assert!(ts.truncated);
        assert!(ts.windows().is_empty());
    }
}
