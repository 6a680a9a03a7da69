//! Parameter sweeps: `--sweep key=v1,v2,...` (repeatable) and the grid of points they span.
//!
//! Each point is a set of overrides layered on top of the scenario and the flags: engine
//! settings, and two workload keys (`rate_scale` multiplies every arrival rate, `clients`
//! sets a closed loop's client count), so one command draws latency against load. The grid is the cartesian product of the axes, first axis outermost, so the order
//! of runs (and of the report) depends only on the command line.

use super::arrivals::Arrivals;
use super::cluster::ClusterRouting;
use super::settings::EngineSettings;
use super::SimError;
use crate::core::BatchingMode;

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
    /// 0 or 1: `dispatch_when_idle` off or on.
    DispatchWhenIdle,
    /// Multiplies every arrival rate of the workload ([`Arrivals::scaled`]).
    RateScale,
    /// A closed loop's client count ([`Arrivals::with_clients`]).
    Clients,
    /// 0 (`request`) or 1 (`continuous`): the batching mode, on the same requests.
    Mode,
    /// 0 or 1: continuous batching's prefix caching off or on, on the same requests.
    PrefixCaching,
    /// Continuous: the routing strategy in front of the replicas, by name (an index into
    /// [`ClusterRouting::ALL`]), on the same requests.
    Routing,
    /// LoRA adapter slots per replica / adapters per batch, on the same requests.
    MaxLoras,
}

impl SweepKey {
    /// Every key, as listed in help and errors.
    pub const ALL: [SweepKey; 15] = [
        SweepKey::Bins,
        SweepKey::OracleBins,
        SweepKey::MaxBatchSize,
        SweepKey::MinBatchSize,
        SweepKey::Workers,
        SweepKey::MaxWaitMs,
        SweepKey::MinWaitMs,
        SweepKey::QueueCapacity,
        SweepKey::DispatchWhenIdle,
        SweepKey::RateScale,
        SweepKey::Clients,
        SweepKey::Mode,
        SweepKey::PrefixCaching,
        SweepKey::Routing,
        SweepKey::MaxLoras,
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
            SweepKey::DispatchWhenIdle => "dispatch_when_idle",
            SweepKey::RateScale => "rate_scale",
            SweepKey::Clients => "clients",
            SweepKey::Mode => "mode",
            SweepKey::PrefixCaching => "prefix_caching",
            SweepKey::Routing => "routing",
            SweepKey::MaxLoras => "max_loras",
        }
    }

    /// True for the keys that change the workload (and so the request sequence).
    pub fn is_workload(self) -> bool {
        matches!(self, SweepKey::RateScale | SweepKey::Clients)
    }

    /// What a value must be, or `None` when `x` is fine.
    fn check(self, x: f64) -> Option<&'static str> {
        let whole = x.is_finite() && x.fract() == 0.0;
        match self {
            SweepKey::DispatchWhenIdle | SweepKey::PrefixCaching => {
                (!(x == 0.0 || x == 1.0)).then_some("0 or 1")
            }
            SweepKey::Mode => {
                (!(x == 0.0 || x == 1.0)).then_some("request or continuous (or 0 or 1)")
            }
            SweepKey::Routing => ClusterRouting::of_value(x)
                .is_none()
                .then_some("round_robin, least_loaded, power_of_two, prefix_aware or session"),
            SweepKey::RateScale => (!(x.is_finite() && x > 0.0)).then_some("a number > 0"),
            SweepKey::MaxWaitMs | SweepKey::MinWaitMs => {
                (!(x.is_finite() && x >= 0.0)).then_some("a number >= 0")
            }
            _ => {
                (!(whole && x >= 1.0 && x <= f64::from(u32::MAX))).then_some("a whole number >= 1")
            }
        }
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
        let named = match (key, v) {
            (SweepKey::Mode, "request") => Some(0.0),
            (SweepKey::Mode, "continuous") => Some(1.0),
            (SweepKey::Routing, name) => ClusterRouting::from_name(name).map(|r| r.index() as f64),
            _ => None,
        };
        let x: f64 = named.map_or_else(|| v.parse(), Ok).map_err(|_| {
            let want = match key {
                SweepKey::Mode => "request or continuous",
                SweepKey::Routing => {
                    "round_robin, least_loaded, power_of_two, prefix_aware or session"
                }
                _ => "a number",
            };
            SimError::invalid("--sweep", format!("{}: '{v}' is not {want}", key.as_str()))
        })?;
        if let Some(want) = key.check(x) {
            return Err(SimError::invalid(
                "--sweep",
                format!("{}: {v} must be {want}", key.as_str()),
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
            SweepKey::DispatchWhenIdle => s.dispatch_when_idle = Some(v != 0.0),
            SweepKey::Mode => s.mode = Some(mode_of(v)),
            SweepKey::PrefixCaching => s.prefix_caching = Some(v != 0.0),
            SweepKey::Routing => s.routing = ClusterRouting::of_value(v),
            SweepKey::MaxLoras => s.max_loras = Some(v as usize),
            SweepKey::RateScale | SweepKey::Clients => {}
        }
    }
    s
}

/// The batching mode a `mode` sweep value stands for.
pub fn mode_of(v: f64) -> BatchingMode {
    if v == 0.0 {
        BatchingMode::Request
    } else {
        BatchingMode::Continuous
    }
}

/// The arrivals of one point: `base` with the point's workload keys applied; `None` when the
/// point has none (the scenario's request sequence serves it).
pub fn arrivals(base: &Arrivals, point: &[(SweepKey, f64)]) -> Result<Option<Arrivals>, SimError> {
    let mut out: Option<Arrivals> = None;
    for &(key, v) in point {
        let cur = out.as_ref().unwrap_or(base);
        match key {
            SweepKey::RateScale => out = Some(cur.scaled(v)?),
            SweepKey::Clients => out = Some(cur.with_clients(v as u32)?),
            _ => {}
        }
    }
    Ok(out)
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
        let e = parse_axis("dispatch_when_idle=2").unwrap_err().to_string();
        assert!(e.contains("0 or 1"), "{e}");
        assert!(parse_axis("rate_scale=0").is_err());
        assert!(parse_axis("rate_scale=0.25,1.5").is_ok());
        assert_eq!(
            parse_axis("mode=request,continuous").unwrap().values,
            vec![0.0, 1.0]
        );
        let e = parse_axis("mode=batch").unwrap_err().to_string();
        assert!(e.contains("request or continuous"), "{e}");
    }

    #[test]
    fn workload_keys_change_the_arrivals_and_nothing_else() {
        let base = Arrivals::Poisson { rate_rps: 10.0 };
        let g = grid(&[
            parse_axis("rate_scale=0.5,2").unwrap(),
            parse_axis("dispatch_when_idle=0").unwrap(),
        ]);
        assert_eq!(
            arrivals(&base, &g[1]).unwrap(),
            Some(Arrivals::Poisson { rate_rps: 20.0 })
        );
        assert_eq!(arrivals(&base, &[]).unwrap(), None);
        let s = apply(&EngineSettings::default(), &g[0]);
        assert_eq!(s.dispatch_when_idle, Some(false));
        assert!(arrivals(&base, &[(SweepKey::Clients, 4.0)]).is_err());
    }
}
