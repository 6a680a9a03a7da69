//! Who gives way when connections run short: slow and idle clients must not lock others out.
//!
//! Two rules, after nginx (reuse idle keep-alive connections when out of them) and Kestrel
//! (a minimum request data rate after a grace period):
//!
//! - **Minimum data rate.** A request head or body in progress is judged by the bytes
//!   received since its first byte over the time since: below
//!   `server.min_data_rate_bytes_per_sec` once `server.min_data_rate_grace` has passed, it
//!   is answered 408 and the connection closes ([`DataRate::too_slow`]).
//! - **At the connection limit** a new connection takes the place of the connection idle the
//!   longest (no request in progress, nothing owed to it); when none is idle, of the slowest
//!   connection receiving a request below the minimum rate, grace or not (the grace is a
//!   courtesy while slots are spare). Only when there is neither is the newcomer refused
//!   with 503 ([`victim`]).
//!
//! A connection that is owed a response (a request in the engine, bytes to write) is never
//! chosen here: it is busy, not idle, and its answers are the exactly-once promise. What
//! must never happen here: I/O, reading a clock (time is passed in), or judging a
//! connection by anything the client cannot control (engine latency is not its fault).

use super::conn::Conn;
use crate::metrics::http_stats::Eviction;
use std::time::{Duration, Instant};

/// The minimum data rate a request must keep up, from `[server]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataRate {
    /// Bytes per second; 0 turns the rule off.
    pub min_bytes_per_sec: u64,
    /// Time from a request's first byte before the rate applies (outside the limit).
    pub grace: Duration,
}

/// What a connection is doing, as far as eviction cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// No request in progress, nothing owed, not closing: idle since `since`.
    Idle { since: Instant },
    /// A request head or body in progress since `started`, `bytes` of it received.
    Receiving { started: Instant, bytes: usize },
    /// Owed a response, closing, waiting for `100 Continue`, or paused by the server: never
    /// evicted here.
    Busy,
}

impl Standing {
    /// The standing of `conn`. A request's bytes received so far are the read buffer: a
    /// request stays there until it is complete (bytes of a pipelined request after it only
    /// make the rate look better, never worse).
    pub fn of(conn: &Conn) -> Standing {
        let owed = !conn.is_quiet();
        if conn.read_done || conn.close_when_flushed {
            return Standing::Busy;
        }
        let awaiting_continue = conn
            .partial
            .as_ref()
            .is_some_and(|p| p.head.expect_continue && !p.continue_sent);
        match conn.request_started {
            Some(started) if !awaiting_continue && !owed => Standing::Receiving {
                started,
                bytes: conn.read_buf.len(),
            },
            // A request in progress behind answers still owed: the client may be waiting
            // for them before it sends the rest (it is judged by the read timeout).
            Some(_) => Standing::Busy,
            None if !owed && conn.read_buf.is_empty() && conn.partial.is_none() => Standing::Idle {
                since: conn.last_activity,
            },
            None => Standing::Busy,
        }
    }
}

impl DataRate {
    /// `bytes` over `elapsed` is below the minimum rate (false when the rule is off).
    pub fn below(&self, bytes: usize, elapsed: Duration) -> bool {
        // bytes / elapsed_s < min  <=>  bytes * 1e9 < min * elapsed_ns; u128 cannot overflow.
        self.min_bytes_per_sec > 0
            && (bytes as u128) * 1_000_000_000
                < u128::from(self.min_bytes_per_sec) * elapsed.as_nanos()
    }

    /// The request in progress has had its grace and is below the minimum rate: answer
    /// 408 and close.
    pub fn too_slow(&self, standing: Standing, now: Instant) -> bool {
        match standing {
            Standing::Receiving { started, bytes } => {
                let elapsed = now.saturating_duration_since(started);
                elapsed > self.grace && self.below(bytes, elapsed)
            }
            _ => false,
        }
    }
}

/// The connection to close so that a newcomer fits under the connection limit: the one idle
/// the longest, else the slowest one receiving below the minimum rate. `None`: refuse the
/// newcomer.
pub fn victim(
    standings: impl IntoIterator<Item = (usize, Standing)>,
    rate: &DataRate,
    now: Instant,
) -> Option<(usize, Eviction)> {
    let mut idle: Option<(usize, Instant)> = None;
    // (index, bytes, elapsed): the lowest bytes / elapsed.
    let mut slow: Option<(usize, usize, Duration)> = None;
    for (idx, standing) in standings {
        match standing {
            Standing::Idle { since } => {
                if idle.is_none_or(|(_, s)| since < s) {
                    idle = Some((idx, since));
                }
            }
            Standing::Receiving { started, bytes } => {
                let elapsed = now.saturating_duration_since(started);
                if !rate.below(bytes, elapsed) {
                    continue;
                }
                let slower = slow.is_none_or(|(_, b, e)| {
                    // bytes / elapsed < b / e, cross-multiplied.
                    (bytes as u128) * e.as_nanos() < (b as u128) * elapsed.as_nanos()
                });
                if slower {
                    slow = Some((idx, bytes, elapsed));
                }
            }
            Standing::Busy => {}
        }
    }
    match (idle, slow) {
        (Some((idx, _)), _) => Some((idx, Eviction::IdleAtLimit)),
        (None, Some((idx, _, _))) => Some((idx, Eviction::SlowAtLimit)),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: DataRate = DataRate {
        min_bytes_per_sec: 240,
        grace: Duration::from_secs(5),
    };

    #[test]
    fn the_rate_is_bytes_over_time_and_zero_turns_it_off() {
        assert!(RATE.below(239, Duration::from_secs(1)));
        assert!(!RATE.below(240, Duration::from_secs(1)));
        assert!(!RATE.below(0, Duration::ZERO), "no time, no verdict");
        let off = DataRate {
            min_bytes_per_sec: 0,
            ..RATE
        };
        assert!(!off.below(0, Duration::from_secs(3600)));
    }

    #[test]
    fn a_slow_request_is_too_slow_only_after_its_grace() {
        let t0 = Instant::now();
        let slow = Standing::Receiving {
            started: t0,
            bytes: 101,
        };
        assert!(
            !RATE.too_slow(slow, t0 + Duration::from_secs(5)),
            "in grace"
        );
        assert!(RATE.too_slow(slow, t0 + Duration::from_secs(6)));
        let steady = Standing::Receiving {
            started: t0,
            bytes: 2_000,
        };
        assert!(!RATE.too_slow(steady, t0 + Duration::from_secs(6)));
        let idle = Standing::Idle { since: t0 };
        assert!(!RATE.too_slow(idle, t0 + Duration::from_secs(600)));
        assert!(!RATE.too_slow(Standing::Busy, t0 + Duration::from_secs(600)));
    }

    #[test]
    fn at_the_limit_the_longest_idle_goes_first_then_the_slowest() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(2);
        let recv = |bytes| Standing::Receiving { started: t0, bytes };
        let all = [
            (0, Standing::Busy),
            (1, recv(100)),
            (
                2,
                Standing::Idle {
                    since: t0 + Duration::from_secs(1),
                },
            ),
            (3, recv(10)),
            (4, Standing::Idle { since: t0 }),
            (5, recv(100_000)),
        ];
        assert_eq!(victim(all, &RATE, now), Some((4, Eviction::IdleAtLimit)));
        let no_idle = all
            .into_iter()
            .filter(|(_, s)| !matches!(s, Standing::Idle { .. }));
        assert_eq!(
            victim(no_idle, &RATE, now),
            Some((3, Eviction::SlowAtLimit)),
            "the slowest, grace or not"
        );
        let fast_or_busy = [(0, Standing::Busy), (5, recv(100_000))];
        assert_eq!(victim(fast_or_busy, &RATE, now), None);
    }
}
