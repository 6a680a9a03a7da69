//! Parameter sweeps: `--sweep key=v1,v2,...` (repeatable) and the grid of points they span.
//!
//! Each point is a set of engine-setting overrides layered on top of the scenario and the
//! flags; the grid is the cartesian product of the axes, first axis outermost, so the order
//! of runs (and of the report) depends only on the command line.

use super::settings::EngineSettings;
use super::SimError;

/// A key that can be swept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepKey {
    Bins,
    OracleBins,
    MaxBatchSize,
    MinBatchSize,
    Workers,
    MaxWaitMs,
    MinWaitMs,
    QueueCapacity,
}

impl SweepKey {
    /// Every key, as listed in help and errors.
    pub const ALL: [SweepKey; 8] = [
        SweepKey::Bins,
        SweepKey::OracleBins,
        SweepKey::MaxBatchSize,
        SweepKey::MinBatchSize,
        SweepKey::Workers,
        SweepKey::MaxWaitMs,
        SweepKey::MinWaitMs,
        SweepKey::QueueCapacity,
    ];

    /// Name on the command line and in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            SweepKey::Bins => "bins",
            SweepKey::OracleBins => "oracle_bins",
            SweepKey::MaxBatchSize => "max_batch_size",
            SweepKey::MinBatchSize => "min_batch_size",
            SweepKey::Workers => "workers",
            SweepKey::MaxWaitMs => "max_wait_ms",
            SweepKey::MinWaitMs => "min_wait_ms",
            SweepKey::QueueCapacity => "queue_capacity",
        }
    }

    fn integral(self) -> bool {
        !matches!(self, SweepKey::MaxWaitMs | SweepKey::MinWaitMs)
    }

    fn parse(s: &str) -> Result<SweepKey, SimError> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                SimError::invalid(
                    "--sweep",
                    format!(
                        "unknown key '{s}': valid keys are {}",
                        Self::ALL.map(|k| k.as_str()).join(", ")
                    ),
                )
            })
    }
}

/// One axis: a key and the values it takes, in the order given.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    pub key: SweepKey,
    pub values: Vec<f64>,
}

/// Parses `key=v1,v2,...`.
pub fn parse_axis(spec: &str) -> Result<Axis, SimError> {
    let Some((key, list)) = spec.split_once('=') else {
        return Err(SimError::invalid(
            "--sweep",
            format!("'{spec}' is not key=v1,v2,... (e.g. bins=1,2,4,8)"),
        ));
    };
    let key = SweepKey::parse(key.trim())?;
    let mut values = Vec::new();
    for v in list.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let x: f64 = v.parse().map_err(|_| {
            SimError::invalid(
                "--sweep",
                format!("{}: '{v}' is not a number", key.as_str()),
            )
        })?;
        if !(x.is_finite() && x >= 0.0) || (key.integral() && (x.fract() != 0.0 || x < 1.0)) {
            return Err(SimError::invalid(
                "--sweep",
                format!(
                    "{}: {v} must be {}",
                    key.as_str(),
                    if key.integral() {
                        "a whole number >= 1"
                    } else {
                        "a number >= 0"
                    }
                ),
            ));
        }
        values.push(x);
    }
    if values.is_empty() {
        return Err(SimError::invalid(
            "--sweep",
            format!("{} has no values", key.as_str()),
        ));
    }
    Ok(Axis { key, values })
}

/// Every point of the grid (one empty point when there are no axes).
pub fn grid(axes: &[Axis]) -> Vec<Vec<(SweepKey, f64)>> {
    let mut points: Vec<Vec<(SweepKey, f64)>> = vec![Vec::new()];
    for axis in axes {
        points = points
            .into_iter()
            .flat_map(|p| {
                axis.values.iter().map(move |&v| {
                    let mut q = p.clone();
                    q.push((axis.key, v));
                    q
                })
            })
            .collect();
    }
    points
}

/// The settings of one point: `base` with the point's keys set.
pub fn apply(base: &EngineSettings, point: &[(SweepKey, f64)]) -> EngineSettings {
    let mut s = base.clone();
    for &(key, v) in point {
        match key {
            SweepKey::Bins => s.bins = Some(v as u32),
            SweepKey::OracleBins => s.oracle_bins = Some(v as u32),
            SweepKey::MaxBatchSize => s.max_batch_size = Some(v as usize),
            SweepKey::MinBatchSize => s.min_batch_size = Some(v as usize),
            SweepKey::Workers => s.workers = Some(v as usize),
            SweepKey::MaxWaitMs => s.max_wait_ms = Some(v),
            SweepKey::MinWaitMs => s.min_wait_ms = Some(v),
            SweepKey::QueueCapacity => s.queue_capacity = Some(v as usize),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_is_the_cartesian_product_first_axis_outermost() {
        let a = parse_axis("bins=1,2").unwrap();
        let b = parse_axis("max_wait_ms=5, 50").unwrap();
        let g = grid(&[a, b]);
        let flat: Vec<Vec<f64>> = g.iter().map(|p| p.iter().map(|x| x.1).collect()).collect();
        assert_eq!(
            flat,
            vec![
                vec![1.0, 5.0],
                vec![1.0, 50.0],
                vec![2.0, 5.0],
                vec![2.0, 50.0]
            ]
        );
        assert_eq!(grid(&[]), vec![Vec::new()]);
        let s = apply(&EngineSettings::default(), &g[3]);
        assert_eq!((s.bins, s.max_wait_ms), (Some(2), Some(50.0)));
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let e = parse_axis("speed=1").unwrap_err().to_string();
        assert!(
            e.contains("valid keys are bins, oracle_bins, max_batch_size"),
            "{e}"
        );
        assert!(parse_axis("bins").is_err());
        let e = parse_axis("workers=1.5").unwrap_err().to_string();
        assert!(e.contains("whole number"), "{e}");
        assert!(parse_axis("max_wait_ms=").is_err());
    }
}
