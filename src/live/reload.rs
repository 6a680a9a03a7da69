//! A reload (`SIGHUP`, `POST /admin/reload`): read the config again as at start (file,
//! `ABE_*` environment, flags), check it whole with the start's checks, and apply what can
//! change while abe runs:
//!
//! - backends: a table gone drains its backend; a table back, or with a new `base_url` or
//!   `api_key`, fills its slot (a slot holding requests drains at the old address first);
//!   a new table fills a spare slot (`routing.spare_backend_slots`; none free: reported
//!   and left out); a table whose fixed keys changed (kind, models, priority, workers) is
//!   reported and left as it runs;
//! - `[routing]`: strategy, weights, max_retries, the prefix thresholds, aliases and
//!   fallbacks change (aliases and fallbacks by a swap of the engine's and io threads'
//!   tables); the prefix index's size and the spare slots are reported and kept;
//! - every other key (ports, thread counts, batching mode, limits) is reported and kept.
//!
//! A config that does not check is refused with the start's error, and nothing changes. An
//! engine too busy to take a change is asked again; a reload that still stops half-way says
//! what it applied (the rest runs as before, and the next reload applies it).
//! Runs on the live thread (`thread`), never on an io thread.
//! What must never happen here: a partly applied refusal, or a silent difference between
//! the file and what runs (everything kept is in the report and the log).

use super::{fixed_keys_differ, lock, Added, LiveBackends, LiveError};
use crate::config::{Config, ConfigError, Settings};
use crate::router::SlotState;
use serde::Serialize;

/// What a reload changed, and what it left as it runs (needs a restart).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ReloadReport {
    pub applied: Vec<String>,
    pub kept: Vec<String>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("reload: abe was started without a config source to read again")]
    NoSource,
    #[error("reload refused, the running config stays: {0}")]
    Refused(#[from] ConfigError),
    #[error("reload: {0}")]
    Live(#[from] LiveError),
    #[error("reload: abe is stopping")]
    Stopping,
    /// A reload that stopped half-way: what it applied runs, the rest runs as before. A
    /// reload of the same file applies the rest.
    #[error(
        "reload partly applied ({}), then stopped: {error}; the rest runs as before: \
         reload again to apply it",
        applied.join("; ")
    )]
    Partial {
        applied: Vec<String>,
        error: Box<ReloadError>,
    },
}

impl LiveBackends {
    /// Reads the config again and applies it (see the module doc).
    pub fn reload(&self) -> Result<ReloadReport, ReloadError> {
        let config = {
            let source = lock(&self.source);
            let source = source.as_ref().ok_or(ReloadError::NoSource)?;
            source()?
        };
        let settings = config.check()?;
        let report = self.apply(settings)?;
        for line in &report.applied {
            tracing::info!("reload: applied: {line}");
        }
        for line in &report.kept {
            tracing::warn!("reload: kept as running (needs a restart): {line}");
        }
        Ok(report)
    }

    /// Applies checked `next` settings against what runs.
    pub fn apply(&self, next: Settings) -> Result<ReloadReport, ReloadError> {
        let mut running = lock(&self.running);
        let mut fixed = Vec::new();
        fixed_sections(&running, &next.config, &mut fixed);
        apply_whole(fixed, BUSY_RETRIES, BUSY_PAUSE, |report| {
            // Backends first: new aliases and fallbacks may name a backend's new models.
            self.apply_backends(&next, report)?;
            self.apply_routing(&mut running, &next, report)
        })
    }

    fn apply_routing(
        &self,
        running: &mut Config,
        next: &Settings,
        report: &mut ReloadReport,
    ) -> Result<(), ReloadError> {
        let was_routing = running.routing.clone();
        let (was, now) = (&was_routing, &next.config.routing);
        if was.aliases != now.aliases || was.fallbacks != now.fallbacks {
            self.set_names(&now.aliases, &now.fallbacks)?;
            for (key, changed) in [
                ("routing.aliases", was.aliases != now.aliases),
                ("routing.fallbacks", was.fallbacks != now.fallbacks),
            ] {
                if changed {
                    report.applied.push(key.to_string());
                }
            }
            running.routing.aliases.clone_from(&now.aliases);
            running.routing.fallbacks.clone_from(&now.fallbacks);
        }
        if was.spare_backend_slots != now.spare_backend_slots {
            report
                .kept
                .push("routing.spare_backend_slots: the slots are reserved at start".into());
        }
        if was.prefix.max_tracked_blocks != now.prefix.max_tracked_blocks {
            report
                .kept
                .push("routing.prefix.max_tracked_blocks: the indexes' size is fixed".into());
        }
        let mut changed = Vec::new();
        if was.strategy != now.strategy {
            changed.push(format!(
                "routing.strategy: {} -> {}",
                was.strategy, now.strategy
            ));
        }
        if was.weights != now.weights {
            changed.push("routing.weights".to_string());
        }
        if was.max_retries != now.max_retries {
            changed.push(format!(
                "routing.max_retries: {} -> {}",
                was.max_retries, now.max_retries
            ));
        }
        let mut prefix = now.prefix;
        prefix.max_tracked_blocks = was.prefix.max_tracked_blocks;
        if prefix != was.prefix {
            changed.push("routing.prefix thresholds".to_string());
        }
        if changed.is_empty() {
            return Ok(());
        }
        self.handle
            .set_routing(next.router.live_routing())
            .map_err(|_| LiveError::Busy)?;
        running.routing.strategy.clone_from(&now.strategy);
        running.routing.weights = now.weights;
        running.routing.max_retries = now.max_retries;
        running.routing.prefix = prefix;
        report.applied.extend(changed);
        Ok(())
    }

    fn apply_backends(
        &self,
        next: &Settings,
        report: &mut ReloadReport,
    ) -> Result<(), ReloadError> {
        // Discovery tables are fixed at start (their slots are).
        let plans_now: Vec<_> = next
            .discovery
            .iter()
            .map(|p| (&p.name, &p.discovery))
            .collect();
        let plans_was: Vec<_> = self.plans.iter().map(|p| (&p.name, &p.discovery)).collect();
        if plans_now != plans_was {
            report
                .kept
                .push("backends' discovery tables: fixed at start".into());
        }
        let discovered: Vec<&str> = next
            .discovery
            .iter()
            .flat_map(|p| p.slots.iter().map(|&b| next.backends[b].name.as_str()))
            .collect();
        let plain = || {
            next.backends
                .iter()
                .filter(|b| !b.spare && !discovered.contains(&b.name.as_str()))
        };
        // (name, asked, discovery slot) of every slot, read once; a slot moving to a new
        // address counts as asked to be active (it will be once its drain is over).
        let running: Vec<(String, SlotState, bool)> = lock(&self.slots)
            .iter()
            .map(|s| {
                let asked = if s.moving.is_some() {
                    SlotState::Active
                } else {
                    s.asked
                };
                (s.config.name.clone(), asked, s.plan.is_some())
            })
            .collect();
        for (name, asked, is_discovered) in &running {
            if *is_discovered {
                continue;
            }
            match plain().find(|b| &b.name == name) {
                None if *asked == SlotState::Active => {
                    self.remove(name)?;
                    report
                        .applied
                        .push(format!("backend '{name}': removed (draining)"));
                }
                None => {}
                Some(table) => {
                    let fixed = {
                        let slots = lock(&self.slots);
                        let s = slots.iter().find(|s| &s.config.name == name);
                        s.map(|s| (fixed_keys_differ(&s.config, table), s.config.clone()))
                    };
                    let Some((fixed, was)) = fixed else { continue };
                    if !fixed.is_empty() {
                        report.kept.push(format!(
                            "backend '{name}': {} cannot change live",
                            fixed.join(", ")
                        ));
                        continue;
                    }
                    let moved = was.base_url != table.base_url || was.api_key != table.api_key;
                    if moved || *asked != SlotState::Active {
                        let added = self.add(table)?;
                        let at = table.base_url.as_deref().unwrap_or("-");
                        report.applied.push(match (moved, added) {
                            (true, Added::Moving) => format!(
                                "backend '{name}': moving to {at} (draining at the old \
                                 address first)"
                            ),
                            (true, Added::Active) => format!("backend '{name}': now at {at}"),
                            _ => format!("backend '{name}': added back"),
                        });
                    }
                }
            }
        }
        for table in plain() {
            if running.iter().any(|(name, _, _)| name == &table.name) {
                continue;
            }
            match self.add(table) {
                Ok(_) => report
                    .applied
                    .push(format!("backend '{}': new, in a spare slot", table.name)),
                Err(e @ (LiveError::NoSlot(_) | LiveError::Invalid(_))) => {
                    report.kept.push(format!("backend '{}': {e}", table.name));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// How often a reload that found the engine's control queue full tries again, and how long
/// it waits between tries (the engine empties the queue every turn; a full one means a burst
/// of admin changes or an engine that is stopping).
const BUSY_RETRIES: u32 = 20;
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Runs `attempt` (one pass that applies what differs from what runs, pushing a line per
/// change) until it succeeds. A pass compares the file with what runs, so a pass after one
/// stopped half-way applies only the rest: a `Busy` engine is tried again up to `retries`
/// times, and the lines of every pass add up. A pass that still fails after changing
/// something is a [`ReloadError::Partial`] naming what was applied; one that changed nothing
/// is its own error. `kept` (what needs a restart) is the same for every pass.
fn apply_whole(
    kept: Vec<String>,
    retries: u32,
    pause: std::time::Duration,
    mut attempt: impl FnMut(&mut ReloadReport) -> Result<(), ReloadError>,
) -> Result<ReloadReport, ReloadError> {
    let mut report = ReloadReport::default();
    let mut tries = 0;
    loop {
        report.kept.clone_from(&kept);
        match attempt(&mut report) {
            Ok(()) => return Ok(report),
            Err(ReloadError::Live(LiveError::Busy)) if tries < retries => {
                tries += 1;
                std::thread::sleep(pause);
            }
            Err(e) if report.applied.is_empty() => return Err(e),
            Err(e) => {
                return Err(ReloadError::Partial {
                    applied: report.applied,
                    error: Box::new(e),
                })
            }
        }
    }
}

/// The keys outside `[[backends]]` and `[routing]` that differ: each needs a restart.
fn fixed_sections(running: &Config, next: &Config, kept: &mut Vec<String>) {
    let (Ok(toml::Value::Table(a)), Ok(toml::Value::Table(b))) =
        (toml::Value::try_from(running), toml::Value::try_from(next))
    else {
        kept.push(
            "the config could not be compared; nothing outside backends and routing \
                   changed"
                .into(),
        );
        return;
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        if key == "backends" || key == "routing" {
            continue;
        }
        match (a.get(key), b.get(key)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                let mut sub: Vec<&String> = x.keys().chain(y.keys()).collect();
                sub.sort();
                sub.dedup();
                for k in sub {
                    if x.get(k) != y.get(k) {
                        kept.push(format!("{key}.{k}: needs a restart"));
                    }
                }
            }
            (x, y) if x != y => kept.push(format!("{key}: needs a restart")),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn kept() -> Vec<String> {
        vec!["server.port: needs a restart".to_string()]
    }

    /// A pass that finds the engine busy after one change is tried again, applies only the
    /// rest, and the report holds each change once and `kept` once.
    #[test]
    fn a_busy_engine_is_asked_again_and_the_passes_add_up() {
        let mut todo = vec!["backend 'b': new", "backend 'a': removed"];
        let mut passes = 0;
        let report = apply_whole(kept(), 3, Duration::ZERO, |report| {
            passes += 1;
            // Applies what is left; the first pass stops after one change, busy.
            while let Some(line) = todo.pop() {
                report.applied.push(line.to_string());
                if passes == 1 {
                    return Err(ReloadError::Live(LiveError::Busy));
                }
            }
            Ok(())
        })
        .expect("the second pass applies the rest");
        assert_eq!(passes, 2);
        assert_eq!(
            report.applied,
            ["backend 'a': removed", "backend 'b': new"],
            "each change once, in the order applied"
        );
        assert_eq!(report.kept, kept(), "kept is not repeated per pass");
    }

    /// A reload that still fails after changing something says what it changed; one that
    /// changed nothing is its own error; retries are bounded.
    #[test]
    fn a_reload_that_stops_half_way_names_what_it_applied() {
        let mut passes = 0;
        let err = apply_whole(kept(), 2, Duration::ZERO, |report| {
            passes += 1;
            if passes == 1 {
                report.applied.push("backend 'a': removed".into());
            }
            Err(ReloadError::Live(LiveError::Busy))
        })
        .expect_err("busy every time");
        assert_eq!(passes, 3, "one pass and two retries");
        match &err {
            ReloadError::Partial { applied, error } => {
                assert_eq!(applied, &["backend 'a': removed"]);
                assert!(matches!(**error, ReloadError::Live(LiveError::Busy)));
            }
            other => panic!("expected Partial, got {other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("backend 'a': removed") && text.contains("reload again"),
            "{text}"
        );

        let err = apply_whole(kept(), 2, Duration::ZERO, |_| {
            Err(ReloadError::Live(LiveError::NotFound("x".into())))
        })
        .expect_err("fails at once");
        assert!(
            matches!(err, ReloadError::Live(LiveError::NotFound(_))),
            "nothing applied, no retry of a non-busy error: {err:?}"
        );
    }
}
