//! The `discovery` key of a `[[backends]]` table: a DNS name to follow instead of a fixed
//! `base_url` (`slots` expands it into backend slots; `crate::live::discovery` resolves
//! it). Plain config data: nothing here resolves anything.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most slots one `discovery` table may reserve when it does not say (`max_addresses`).
pub const DISCOVERY_MAX_ADDRESSES_DEFAULT: u32 = 8;

/// Most slots one `discovery` table may reserve at all (each has its own workers).
pub const DISCOVERY_MAX_ADDRESSES_MAX: u32 = 64;

/// `discovery = { dns = "...", port = 8000, every = "5s", max_addresses = 8 }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    /// The name to resolve (a Kubernetes headless Service: one A record per ready pod).
    pub dns: String,
    /// The port every address serves on.
    pub port: u16,
    /// How often to resolve again: `"5s"`, `"500ms"`, `"1m"` or an integer of ms.
    #[serde(
        default = "every_default",
        serialize_with = "ser_ms",
        deserialize_with = "de_ms"
    )]
    pub every: u64,
    /// Slots reserved for its addresses; addresses beyond them are logged and left out.
    #[serde(default = "max_addresses_default")]
    pub max_addresses: u32,
}

fn every_default() -> u64 {
    5000
}

fn max_addresses_default() -> u32 {
    DISCOVERY_MAX_ADDRESSES_DEFAULT
}

fn ser_ms<S: Serializer>(ms: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{ms}ms"))
}

fn de_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Ms(u64),
        Text(String),
    }
    match Text::deserialize(d)? {
        Text::Ms(ms) => Ok(ms),
        Text::Text(t) => parse_ms(&t).map_err(serde::de::Error::custom),
    }
}

/// `"5s"`, `"250ms"`, `"1m"` as milliseconds.
fn parse_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("'{text}' is not a duration like 5s, 500ms, 1m"))?;
    match unit {
        "" | "ms" => Ok(n),
        "s" => Ok(n.saturating_mul(1000)),
        "m" => Ok(n.saturating_mul(60_000)),
        _ => Err(format!("'{text}': unknown unit '{unit}' (use ms, s or m)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_takes_a_duration_or_milliseconds() {
        assert_eq!(parse_ms("5s"), Ok(5000));
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms("2m"), Ok(120_000));
        assert_eq!(parse_ms("7"), Ok(7));
        assert!(parse_ms("5x").is_err());
        assert!(parse_ms("s").is_err());
    }
}
