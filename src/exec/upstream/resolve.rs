//! Name resolution for an upstream backend's connection pool: an address that is already an
//! IP (`127.0.0.1:8000`, `[::1]:8000`) is parsed, not looked up, and a host name's addresses
//! are kept for [`NAME_TTL`].
//!
//! Why it exists: `ureq` resolves the address before it looks in its pool, so every request
//! resolves, even on a kept-alive connection, and with a time limit set (abe always sets
//! one) its resolver starts a thread per lookup. Forwarding small requests one by one,
//! that thread and `getaddrinfo` were most of the front's CPU per request.
//!
//! What must never happen here: a failed lookup kept (the next request looks again), or a
//! lookup without the request's time limit.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How long a host name's addresses are used before it is looked up again. Addresses are
/// used only to open a connection (kept-alive ones stay where they are), so this bounds how
/// long new connections go to a name's old address after its DNS record changes.
pub(super) const NAME_TTL: Duration = Duration::from_secs(5);

/// The resolver of one backend's agent (one base URL, so one entry is kept).
#[derive(Debug, Default)]
pub(super) struct KeptResolver {
    lookup: DefaultResolver,
    /// The last successful lookup of a host name: `host:port`, when, and its addresses.
    kept: Mutex<Option<(String, Instant, ResolvedSocketAddrs)>>,
}

impl Resolver for KeptResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let Some(authority) = uri.authority() else {
            return self.lookup.resolve(uri, config, timeout);
        };
        if let Some(addr) = ip_literal(authority.host(), authority.port_u16()) {
            let mut addrs = self.empty();
            addrs.push(addr);
            return Ok(addrs);
        }
        let key = authority.as_str();
        let now = Instant::now();
        {
            let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((host, at, addrs)) = kept.as_ref() {
                if host == key && now.duration_since(*at) < NAME_TTL {
                    return Ok(addrs.clone());
                }
            }
        }
        // Looked up outside the lock: a slow lookup must not hold the other workers'
        // requests on a name they already know.
        let addrs = self.lookup.resolve(uri, config, timeout)?;
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        *kept = Some((key.to_string(), now, addrs.clone()));
        Ok(addrs)
    }
}

/// `host` as an IP address (`127.0.0.1`, or `[::1]` as a URI writes it) with the port,
/// or `None` for a name (or a URI without a port: the lookup applies the scheme's default).
fn ip_literal(host: &str, port: Option<u16>) -> Option<SocketAddr> {
    let port = port?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(SocketAddr::new(bare.parse().ok()?, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn resolve(resolver: &KeptResolver, url: &str) -> Result<Vec<SocketAddr>, ureq::Error> {
        let uri: Uri = url.parse().unwrap();
        let config = ureq::Agent::config_builder().build();
        let timeout = NextTimeout {
            after: Duration::from_secs(5).into(),
            reason: ureq::Timeout::Resolve,
            ..NextTimeout::default()
        };
        resolver
            .resolve(&uri, &config, timeout)
            .map(|a| a.iter().copied().collect())
    }

    #[test]
    fn ip_addresses_are_parsed_not_looked_up() {
        let r = KeptResolver::default();
        assert_eq!(
            resolve(&r, "http://127.0.0.1:8000/v1/completions").unwrap(),
            vec!["127.0.0.1:8000".parse().unwrap()]
        );
        assert_eq!(
            resolve(&r, "http://[::1]:9000/x").unwrap(),
            vec!["[::1]:9000".parse().unwrap()]
        );
        assert!(r.kept.lock().unwrap().is_none(), "an IP is not kept");
    }

    #[test]
    fn a_name_is_kept_and_a_failure_is_not() {
        let r = KeptResolver::default();
        let first = resolve(&r, "http://localhost:8000/v1/models").unwrap();
        assert!(first
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8000));
        let kept = r
            .kept
            .lock()
            .unwrap()
            .clone()
            .expect("a name's addresses are kept");
        assert_eq!(kept.0, "localhost:8000");
        // Another port of the same name is looked up again, not served the first's.
        let other = resolve(&r, "http://localhost:8001/").unwrap();
        assert!(other.iter().all(|a| a.port() == 8001));
        assert!(resolve(&r, "http://no-such-host.invalid:8000/").is_err());
        assert_eq!(
            r.kept.lock().unwrap().as_ref().map(|k| k.0.as_str()),
            Some("localhost:8001"),
            "a failed lookup leaves the last good entry"
        );
    }
}
