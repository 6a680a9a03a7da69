//! The simulator: the real sans-IO core driven in virtual time by a discrete-event loop.
//!
//! A [`scenario::Scenario`] (built in, or a TOML file) describes a workload (arrivals and
//! request shapes), engine settings and a latency model. [`run::simulate`] generates the
//! request sequence once from a seed, feeds the identical sequence to every strategy (and
//! every sweep point), and returns a [`report::SimReport`]; [`output`] writes it as JSON,
//! CSV time series and SVG charts; [`table`] is the run table that it and `abe loadgen` print.
//!
//! What must never happen here: reading the wall clock, sleeping, or letting anything that
//! is not a function of (seed, scenario, options) into a report. Same inputs, same bytes.
//! Nothing here prints or exits; the binary does that.

pub mod arrivals;
pub mod binning;
pub mod cluster;
pub mod continuous;
pub mod dist;
pub mod driver;
pub mod help;
pub mod output;
pub mod plot;
pub mod prefix;
pub mod priority;
pub mod record;
pub mod report;
pub mod reuse;
pub mod run;
pub mod scenario;
pub mod series;
pub mod settings;
pub mod sweep;
pub mod table;
pub mod tokens;
pub mod trace;
pub mod workload;

pub use run::{simulate, simulate_scenario, SimulateOptions};

use std::path::PathBuf;

/// Everything that can go wrong in a simulation, with a message a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A scenario, flag or sweep value is out of range or inconsistent.
    #[error("invalid {what}: {why}")]
    Invalid { what: String, why: String },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A scenario or trace file is malformed.
    #[error("{path}: {why}")]
    Parse { path: String, why: String },
    /// `--scenario` named neither a built-in scenario nor an existing file.
    #[error("unknown scenario '{name}': built-in scenarios are {valid}; or give the path of a .toml scenario file")]
    UnknownScenario { name: String, valid: String },
    /// A strategy name abe does not know.
    #[error(transparent)]
    UnknownStrategy(#[from] crate::core::strategy::UnknownStrategy),
    /// The event loop stopped making progress: a bug in the driver or the core.
    #[error("simulation stalled at t = {now_ns} ns (seed {seed}): the core asked to be polled again at the same instant {polls} times without acting")]
    Stalled { now_ns: u64, seed: u64, polls: u32 },
    /// A chart could not be drawn.
    #[error("cannot draw {path}: {why}")]
    Plot { path: PathBuf, why: String },
}

impl SimError {
    /// An [`SimError::Invalid`] for `what` with reason `why`.
    pub fn invalid(what: impl Into<String>, why: impl Into<String>) -> SimError {
        SimError::Invalid {
            what: what.into(),
            why: why.into(),
        }
    }
}
