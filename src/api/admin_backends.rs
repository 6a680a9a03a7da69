//! `/admin/backends` and `/admin/reload`: backends that come and go while abe serves.
//! `GET /admin/backends` lists every backend slot and its state, `POST /admin/backends`
//! adds one (a `[[backends]]` table as JSON), `DELETE /admin/backends/{name}` removes one
//! (it drains), `POST /admin/reload` reads the config again (as `SIGHUP` does).
//!
//! Called by `admin` after the token check, on io threads. A reload runs on the live thread
//! (`crate::live::thread`: reading and checking a file is no io thread's work) and its answer
//! is written when it is done (`Routed::Later`). An add or remove is the control plane's
//! short lock and a control message; an add of a new backend also waits for the engine to
//! swap its tables (one turn). What must never happen here: a refused change that changes
//! something.

use super::deferred::Deferred;
use super::{ApiContext, Routed};
use crate::http::parse::{Head, Method};
use crate::http::response::{Response, Status};
use crate::live::reload::{ReloadError, ReloadReport};
use crate::live::{Added, LiveBackends, LiveError};
use crate::router::BackendConfig;
use std::sync::Arc;

/// `/admin/backends[/{name}]`; `None` when `path` is neither.
pub fn backends(ctx: &ApiContext, head: &Head, path: &str, body: &[u8]) -> Option<Response> {
    let rest = path.strip_prefix("/admin/backends")?;
    let Some(live) = &ctx.live else {
        return Some(no_live());
    };
    Some(match (rest.strip_prefix('/'), head.method) {
        (None, Method::Get | Method::Head) if rest.is_empty() => list(live),
        (None, Method::Post) if rest.is_empty() => add(live, body),
        (Some(name), Method::Delete) if !name.is_empty() => match live.remove(name) {
            Ok(()) => {
                tracing::info!(backend = name, "backend removed via admin API: draining");
                ok_json(&serde_json::json!({ "name": name, "requested": "draining" }))
            }
            Err(e) => live_error(&e),
        },
        (None, _) if rest.is_empty() => not_allowed(
            "/admin/backends supports GET and POST",
            "Allow: GET, HEAD, POST",
        ),
        (Some(_), _) => not_allowed("/admin/backends/{name} supports DELETE", "Allow: DELETE"),
        _ => return None,
    })
}

/// `POST /admin/reload` (allowed): queued on the live thread, answered when it is done;
/// `None` without a control plane (then `reload` answers).
pub fn reload_later(ctx: &ApiContext) -> Option<Routed> {
    let live = ctx.live.as_ref()?;
    let deferred = Arc::new(Deferred::default());
    let answer = deferred.clone();
    live.queue_reload(Box::new(move |outcome| {
        answer.fill(reload_response(outcome));
    }));
    Some(Routed::Later(deferred))
}

/// `POST /admin/reload` run on the calling thread; `None` for another path.
pub fn reload(ctx: &ApiContext, head: &Head, path: &str) -> Option<Response> {
    if path != "/admin/reload" {
        return None;
    }
    if head.method != Method::Post {
        return Some(not_allowed("/admin/reload supports POST", "Allow: POST"));
    }
    let Some(live) = &ctx.live else {
        return Some(no_live());
    };
    Some(reload_response(live.reload()))
}

/// A reload's outcome as its HTTP answer.
fn reload_response(outcome: Result<ReloadReport, ReloadError>) -> Response {
    match outcome {
        Ok(report) => ok_json(&report),
        Err(e @ ReloadError::Refused(_)) => {
            tracing::error!("{e}");
            Response::error(Status::BadRequest, "reload_refused", e.to_string())
        }
        Err(e @ ReloadError::NoSource) => {
            Response::error(Status::BadRequest, "reload_unavailable", e.to_string())
        }
        Err(ReloadError::Live(e)) => live_error(&e),
        Err(e @ ReloadError::Stopping) => {
            Response::error(Status::ServiceUnavailable, "stopping", e.to_string())
        }
        Err(e @ ReloadError::Partial { .. }) => {
            tracing::error!("{e}");
            let busy = matches!(&e, ReloadError::Partial { error, .. }
                if matches!(**error, ReloadError::Live(LiveError::Busy) | ReloadError::Stopping));
            let status = if busy {
                Status::ServiceUnavailable
            } else {
                Status::Conflict
            };
            Response::error(status, "reload_partial", e.to_string())
        }
    }
}

fn list(live: &LiveBackends) -> Response {
    ok_json(&serde_json::json!({ "backends": live.list() }))
}

/// Whether the JSON object `body` (already read as a table) has `key` at its top level.
fn names_key(body: &[u8], key: &str) -> bool {
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body)
        .is_ok_and(|m| m.contains_key(key))
}

fn add(live: &LiveBackends, body: &[u8]) -> Response {
    let config = match serde_json::from_slice::<BackendConfig>(body) {
        Ok(c) => c,
        Err(e) => {
            return Response::error(
                Status::BadRequest,
                "invalid_backend",
                format!(
                    "POST /admin/backends takes one [[backends]] table as a JSON object \
                     (name, kind, base_url, models, ...): {e}"
                ),
            )
        }
    };
    // Left out, the workers are the slot's it goes to (its table's, or a spare's).
    let added = if names_key(body, "max_concurrent_batches") {
        live.add(&config)
    } else {
        live.add_with_the_slots_workers(&config)
    };
    match added {
        Ok(Added::Active) => {
            tracing::info!(backend = %config.name, "backend added via admin API");
            ok_json(&serde_json::json!({ "name": config.name, "requested": "active" }))
        }
        Ok(Added::Moving) => {
            tracing::info!(backend = %config.name, "backend moving via admin API");
            let body = serde_json::json!({
                "name": config.name,
                "requested": "moving",
                "why": "requests already routed to it finish at its old address; it takes \
                        the new one once its drain is over",
            });
            ok_json(&body)
        }
        Err(e) => live_error(&e),
    }
}

fn live_error(e: &LiveError) -> Response {
    let (status, code) = match e {
        LiveError::NotFound(_) => (Status::NotFound, "backend_not_found"),
        LiveError::Invalid(_) => (Status::BadRequest, "invalid_backend"),
        LiveError::NoSlot(_) | LiveError::Fixed { .. } | LiveError::Discovered { .. } => {
            (Status::Conflict, "backend_conflict")
        }
        LiveError::Busy => (Status::ServiceUnavailable, "busy"),
    };
    Response::error(status, code, e.to_string())
}

fn ok_json(body: &impl serde::Serialize) -> Response {
    Response::json(Status::Ok, serde_json::to_vec(body).unwrap_or_default())
}

fn not_allowed(why: &str, allow: &'static str) -> Response {
    Response::error(Status::MethodNotAllowed, "method_not_allowed", why).with_header(allow)
}

fn no_live() -> Response {
    Response::error(
        Status::NotFound,
        "not_found",
        "backends cannot change in this server (not started by `abe serve`)",
    )
}
