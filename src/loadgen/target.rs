//! The load generator's target: an `http://host:port[/prefix]` URL, resolved once to a socket
//! address, with the `Host` header and path prefix every request uses.
//!
//! `abe loadgen` sends real traffic to this address. Unless the caller explicitly allows it,
//! every address the host resolves to must be loopback: a load generator aimed at someone
//! else's server by a typo is a denial-of-service tool. Only plain `http` is spoken (no TLS).
//! Nothing here opens a connection.

use super::error::LoadgenError;
use std::net::{SocketAddr, ToSocketAddrs};

/// Where requests go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The URL as given (for reports and messages).
    pub url: String,
    /// The first resolved address; every connection goes here.
    pub addr: SocketAddr,
    /// `Host` header value (`host[:port]` exactly as written in the URL).
    pub host_header: String,
    /// Path prefix without a trailing slash, empty or starting with `/` (e.g. `/proxy`).
    pub base_path: String,
}

fn bad(url: &str, why: impl Into<String>) -> LoadgenError {
    LoadgenError::Url {
        url: url.to_string(),
        why: why.into(),
    }
}

impl Target {
    /// Parses and resolves `url`; refuses non-loopback addresses unless `allow_remote`.
    pub fn parse(url: &str, allow_remote: bool) -> Result<Target, LoadgenError> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            if url.starts_with("https://") {
                bad(
                    url,
                    "https is not supported: abe loadgen speaks plain HTTP/1.1",
                )
            } else {
                bad(url, "must start with http://, like http://127.0.0.1:8080")
            }
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad(url, "no host"));
        }
        if authority.contains('@') {
            return Err(bad(url, "user info (user@host) is not supported"));
        }
        if path.contains(['?', '#']) {
            return Err(bad(url, "give a base URL without query or fragment"));
        }
        // `host:port`, `[v6]:port`, or a host alone (port 80).
        let has_port = match authority.rfind(':') {
            Some(i) => !authority[i..].contains(']'),
            None => false,
        };
        let lookup = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let addrs: Vec<SocketAddr> = lookup
            .to_socket_addrs()
            .map_err(|e| bad(url, format!("cannot resolve '{authority}': {e}")))?
            .collect();
        let Some(&addr) = addrs.first() else {
            return Err(bad(url, format!("'{authority}' resolves to no address")));
        };
        if !allow_remote {
            if let Some(remote) = addrs.iter().find(|a| !a.ip().is_loopback()) {
                return Err(LoadgenError::NotLoopback {
                    url: url.to_string(),
                    addr: *remote,
                });
            }
        }
        Ok(Target {
            url: url.to_string(),
            addr,
            host_header: authority.to_string(),
            base_path: path.trim_end_matches('/').to_string(),
        })
    }

    /// `base_path` + `path` (which starts with `/`).
    pub fn path(&self, path: &str) -> String {
        debug_assert!(path.starts_with('/'));
        format!("{}{path}", self.base_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_urls_parse_with_prefix_and_host_header() {
        let t = Target::parse("http://127.0.0.1:8080", false).unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.host_header, "127.0.0.1:8080");
        assert_eq!(t.path("/v1/completions"), "/v1/completions");
        let t = Target::parse("http://[::1]:9/api/", false).unwrap();
        assert_eq!(t.addr, "[::1]:9".parse().unwrap());
        assert_eq!(t.path("/v1/completions"), "/api/v1/completions");
        let t = Target::parse("http://localhost", false).unwrap();
        assert_eq!(t.addr.port(), 80);
    }

    #[test]
    fn bad_or_remote_urls_are_refused_with_a_reason() {
        let e = Target::parse("https://127.0.0.1:1", false).unwrap_err();
        assert!(e.to_string().contains("https is not supported"), "{e}");
        let e = Target::parse("127.0.0.1:1", false).unwrap_err();
        assert!(e.to_string().contains("http://"), "{e}");
        let e = Target::parse("http://10.1.2.3:8080", false).unwrap_err();
        assert!(e.to_string().contains("--allow-remote"), "{e}");
        assert!(Target::parse("http://10.1.2.3:8080", true).is_ok());
    }
}
