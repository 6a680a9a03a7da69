//! Name resolution for an upstream backend: an address that is already an IP
//! (`127.0.0.1:8000`, `[::1]:8000`) is parsed, not looked up, and a host name's addresses
//! are kept for [`NAME_TTL`].
//!
//! Two users: [`KeptResolver`], the resolver of the health checker's `ureq` agent (`ureq`
//! resolves before it looks in its pool, so every probe would look up, and with a time limit
//! set its own resolver starts a thread per lookup: forwarding small requests through
//! `ureq`, that thread and `getaddrinfo` were most of the front's CPU per request); and
//! [`NameCache`], the event loop's (`mux`), which must not block on a lookup it has done
//! before: past [`NAME_TTL`] it keeps using the address it has while a thread looks again.
//!
//! What must never happen here: a failed lookup kept (the next request looks again), a
//! lookup without the request's time limit (`KeptResolver`), or the event loop blocked on a
//! name it already knows (`NameCache`).

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{mpsc, Mutex};
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

/// The event loop's address of its backend (`mux`): an IP parsed, a name looked up on the
/// loop's thread the first time only, then refreshed by a thread of its own past
/// [`NAME_TTL`] while the address it has stays in use.
#[derive(Debug, Default)]
pub(super) struct NameCache {
    /// `host:port`, when it was looked up, its addresses (never empty).
    kept: Option<(String, Instant, Vec<SocketAddr>)>,
    /// A refresh in flight: its answer, for `host:port`.
    refresh: Option<(String, mpsc::Receiver<io::Result<Vec<SocketAddr>>>)>,
    /// When the last refresh started (one a [`NAME_TTL`] at most, failed ones included).
    refreshed_at: Option<Instant>,
}

impl NameCache {
    /// The addresses of `authority` (`host:port`, or `host` for port 80), in the order to
    /// try them; never empty.
    pub(super) fn addresses(&mut self, authority: &str) -> io::Result<Vec<SocketAddr>> {
        let (host, port) = split_authority(authority);
        if let Some(addr) = ip_literal(host, Some(port)) {
            return Ok(vec![addr]);
        }
        let host_port = format!("{host}:{port}");
        let now = Instant::now();
        self.take_refresh(now);
        match &self.kept {
            Some((name, at, addrs)) if *name == host_port => {
                let addrs = addrs.clone();
                if now.duration_since(*at) >= NAME_TTL {
                    self.start_refresh(&host_port, now);
                }
                Ok(addrs)
            }
            // The first time (or another name): nothing to use meanwhile.
            _ => {
                let addrs = lookup(&host_port)?;
                self.kept = Some((host_port, now, addrs.clone()));
                Ok(addrs)
            }
        }
    }

    /// `host_port` known as `addrs` (tests: a name with an address that refuses).
    #[cfg(test)]
    pub(super) fn seed(&mut self, host_port: &str, addrs: Vec<SocketAddr>) {
        self.kept = Some((host_port.to_string(), Instant::now(), addrs));
    }

    /// Keeps a refresh's answer if it came (a failure keeps the old address).
    fn take_refresh(&mut self, now: Instant) {
        let Some((name, answer)) = &self.refresh else {
            return;
        };
        match answer.try_recv() {
            Ok(Ok(addrs)) => {
                self.kept = Some((name.clone(), now, addrs));
                self.refresh = None;
            }
            Ok(Err(e)) => {
                tracing::warn!(name = %name, error = %e,
                    "looking up an upstream backend's name again failed; keeping its last address");
                self.refresh = None;
            }
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => self.refresh = None,
        }
    }

    fn start_refresh(&mut self, host_port: &str, now: Instant) {
        let recent = self
            .refreshed_at
            .is_some_and(|at| now.duration_since(at) < NAME_TTL);
        if self.refresh.is_some() || recent {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let name = host_port.to_string();
        let spawned = std::thread::Builder::new()
            .name("abe-dns".into())
            .spawn(move || {
                let _ = tx.send(lookup(&name));
            });
        self.refreshed_at = Some(now);
        if spawned.is_ok() {
            self.refresh = Some((host_port.to_string(), rx));
        }
    }
}

/// The addresses of `host_port` (at least one).
fn lookup(host_port: &str) -> io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = host_port.to_socket_addrs()?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no address for '{host_port}'"),
        ));
    }
    Ok(addrs)
}

/// `host` and port of `authority` (`host:port`, `[v6]:port`, or without a port: 80).
fn split_authority(authority: &str) -> (&str, u16) {
    if let Some(rest) = authority.strip_prefix('[') {
        if let Some((host, after)) = rest.split_once(']') {
            let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
            return (host, port.unwrap_or(80));
        }
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host, port),
            Err(_) => (authority, 80),
        },
        _ => (authority, 80),
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
    fn the_loop_s_cache_parses_ips_and_keeps_a_name() {
        let mut names = NameCache::default();
        assert_eq!(
            names.addresses("127.0.0.1:8000").unwrap(),
            vec!["127.0.0.1:8000".parse().unwrap()]
        );
        assert_eq!(
            names.addresses("[::1]:9000").unwrap(),
            vec!["[::1]:9000".parse().unwrap()]
        );
        assert_eq!(names.addresses("10.0.0.1").unwrap()[0].port(), 80);
        assert!(names.kept.is_none(), "an IP is not kept");
        let addrs = names.addresses("localhost:8000").unwrap();
        assert!(addrs
            .iter()
            .all(|a| a.ip().is_loopback() && a.port() == 8000));
        // Past the TTL the kept addresses are still answered, and a refresh starts.
        let old = Instant::now() - NAME_TTL - Duration::from_secs(1);
        names.kept.as_mut().unwrap().1 = old;
        assert_eq!(names.addresses("localhost:8000").unwrap(), addrs);
        assert!(names.refresh.is_some(), "a refresh in flight");
        assert!(names.addresses("no-such-host.invalid:8000").is_err());
    }

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(split_authority("vllm:8000"), ("vllm", 8000));
        assert_eq!(split_authority("vllm"), ("vllm", 80));
        assert_eq!(split_authority("[::1]:81"), ("::1", 81));
        assert_eq!(split_authority("[::1]"), ("::1", 80));
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
