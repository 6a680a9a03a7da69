//! Before a run: check that the target answers, switch its strategy if asked
//! (`POST /admin/strategy/{name}`), and learn which strategy it runs for the report's label.
//!
//! These are single requests on a throw-away connection, made before the schedule starts, so
//! they never delay or mix with the load itself. A refused strategy switch stops the run (a
//! comparison of the wrong strategy would be worse than none); a target that will not say
//! which strategy it runs (not abe, or admin disabled) is labelled `unknown`.

use super::client::ClientConn;
use super::error::LoadgenError;
use super::target::Target;
use std::time::Duration;

fn request(target: &Target, method: &str, path: &str, token: Option<&str>) -> Vec<u8> {
    let mut r = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n",
        target.path(path),
        target.host_header
    );
    if let Some(t) = token.filter(|t| !t.is_empty()) {
        r.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if method == "POST" {
        r.push_str("Content-Length: 0\r\n");
    }
    r.push_str("Connection: close\r\n\r\n");
    r.into_bytes()
}

/// Checks the target is reachable, switches it to `strategy` if one is given (with
/// `token` as the bearer token), and returns the strategy name for the report.
pub fn prepare(
    target: &Target,
    timeout: Duration,
    strategy: Option<&str>,
    token: Option<&str>,
) -> Result<String, LoadgenError> {
    let mut conn = ClientConn::new(target.addr, timeout);
    conn.connect().map_err(|_| LoadgenError::Connect {
        url: target.url.clone(),
        addr: target.addr,
    })?;
    if let Some(name) = strategy {
        let path = format!("/admin/strategy/{name}");
        let resp = conn
            .request(&request(target, "POST", &path, token))
            .map_err(|e| LoadgenError::Admin {
                what: format!("POST {path}"),
                why: format!("no answer ({})", e.as_str()),
            })?;
        if !(200..300).contains(&resp.status) {
            return Err(LoadgenError::Admin {
                what: format!("POST {path}"),
                why: format!(
                    "HTTP {}: {}",
                    resp.status,
                    String::from_utf8_lossy(&resp.body[..resp.body.len().min(500)])
                ),
            });
        }
        return Ok(name.to_string());
    }
    let current = conn
        .request(&request(target, "GET", "/admin/strategy", token))
        .ok()
        .filter(|r| r.status == 200)
        .and_then(|r| serde_json::from_slice::<serde_json::Value>(r.body).ok())
        .and_then(|v| v.get("strategy")?.as_str().map(str::to_string));
    Ok(current.unwrap_or_else(|| "unknown".into()))
}
