//! Durations in config: `"30s"`, `"100ms"`, `"5m"`, `"1h"`, `"250us"`, or an integer of
//! milliseconds. Printed back in the largest whole unit, so `abe config show` round-trips.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A duration written as `"30s"`, `"100ms"`, `"5m"`, `"1h"`, `"250us"` (or an integer of ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Millis(pub u64);

impl Millis {
    /// From nanoseconds, in whole milliseconds (rounded down).
    pub const fn from_nanos(ns: u64) -> Millis {
        Millis(ns / 1_000_000)
    }
    /// As nanoseconds.
    pub fn nanos(self) -> u64 {
        self.0.saturating_mul(1_000_000)
    }
    /// As a std duration.
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms > 0 && ms % 3_600_000 == 0 {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms > 0 && ms % 60_000 == 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms > 0 && ms % 1000 == 0 {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl FromStr for Millis {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("'{s}' is not a duration like 30s, 100ms, 5m, 1h"))?;
        let ms = match unit.trim() {
            "" | "ms" => n,
            "us" => n / 1000.0,
            "s" => n * 1000.0,
            "m" => n * 60_000.0,
            "h" => n * 3_600_000.0,
            other => {
                return Err(format!(
                    "unknown duration unit '{other}' in '{s}': use ms, s, m or h"
                ))
            }
        };
        if !ms.is_finite() || ms < 0.0 {
            return Err(format!("'{s}' is not a non-negative duration"));
        }
        Ok(Millis(ms.round() as u64))
    }
}

impl Serialize for Millis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(ms) => Ok(Millis(ms)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}
