//! `/admin/*`: the bearer-token protected control endpoints. `GET /admin/strategy` and
//! `POST /admin/strategy/{name}` (switch the request-level strategy at run time),
//! `GET`/`POST /admin/faults` (the faults every `sim` worker injects, and the failures by
//! kind answered in front of the engine, `api::faults`); `/admin/backends` and
//! `/admin/reload` are `admin_backends`'.
//!
//! Runs on io threads, like the rest of the API: it only reads the snapshot and pushes
//! control messages, never blocks. What must never happen here: an admin call served
//! while `server.admin_enabled` is off, or with a wrong token, or a refused change that
//! changes something.

use super::{error_response, ApiContext};
use crate::core::strategy::StrategyKind;
use crate::exec::sim::FaultSettings;
use crate::http::parse::{Head, Method};
use crate::http::response::{Response, Status};

/// `/admin/*` as the router sees it: `POST /admin/reload`, once allowed, is answered when
/// the live thread has run it (`admin_backends::reload`); everything else at once.
pub fn route(ctx: &ApiContext, head: &Head, path: &str, body: &[u8]) -> super::Routed {
    if path == "/admin/reload" && head.method == Method::Post && refuse(ctx, head).is_none() {
        if let Some(later) = super::admin_backends::reload_later(ctx) {
            return later;
        }
    }
    super::Routed::Now(admin(ctx, head, path, body))
}

/// `/admin/*`: bearer-token protected control endpoints.
pub fn admin(ctx: &ApiContext, head: &Head, path: &str, body: &[u8]) -> Response {
    if let Some(refused) = refuse(ctx, head) {
        return refused;
    }
    admin_allowed(ctx, head, path, body)
}

/// A 405 for `path`, which takes POST only (with its `Allow` header).
pub(super) fn post_only(path: &str) -> Response {
    Response::error(
        Status::MethodNotAllowed,
        "method_not_allowed",
        format!("{path} supports POST only"),
    )
    .with_header("Allow: POST")
}

/// The refusal of a control call (`/admin/*`, the LoRA load and unload endpoints) while
/// `server.admin_enabled` is off or without the admin token; `None`: allowed.
pub(super) fn refuse(ctx: &ApiContext, head: &Head) -> Option<Response> {
    let server = &ctx.config.server;
    if !server.admin_enabled {
        return Some(Response::error(
            Status::NotFound,
            "not_found",
            "admin endpoints are disabled (server.admin_enabled = false)",
        ));
    }
    if !server.admin_token.is_empty() {
        // Constant time: how long a refusal takes says nothing about the token.
        if !server
            .admin_token
            .matches_bearer(head.authorization.as_deref())
        {
            return Some(
                Response::error(
                    Status::Unauthorized,
                    "unauthorized",
                    "admin endpoints need 'Authorization: Bearer <server.admin_token>'",
                )
                .with_header("WWW-Authenticate: Bearer"),
            );
        }
    }
    None
}

/// [`admin`] once the call is allowed.
fn admin_allowed(ctx: &ApiContext, head: &Head, path: &str, body: &[u8]) -> Response {
    if path == "/admin/strategy" {
        if !matches!(head.method, Method::Get | Method::Head) {
            return Response::error(
                Status::MethodNotAllowed,
                "method_not_allowed",
                "/admin/strategy supports GET; switch with POST /admin/strategy/{name}",
            )
            .with_header("Allow: GET, HEAD");
        }
        let snap = ctx.handle.snapshot();
        let body = serde_json::json!({
            "strategy": snap.strategy.as_str(),
            "valid": StrategyKind::ALL.map(|k| k.as_str()),
        });
        return Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default());
    }
    if path == "/admin/faults" {
        return admin_faults(ctx, head, body);
    }
    if let Some(r) = super::admin_backends::backends(ctx, head, path, body) {
        return r;
    }
    if let Some(r) = super::admin_backends::reload(ctx, head, path) {
        return r;
    }
    let Some(name) = path.strip_prefix("/admin/strategy/") else {
        return Response::error(
            Status::NotFound,
            "not_found",
            format!(
                "no such admin endpoint: {path}; try POST /admin/strategy/{{name}}, \
                 /admin/faults, /admin/backends or POST /admin/reload"
            ),
        );
    };
    if head.method != Method::Post {
        return post_only(path);
    }
    if ctx.config.batching.mode == crate::core::BatchingMode::Continuous {
        return Response::error(
            Status::BadRequest,
            "not_applicable",
            "strategies choose request-level batches; this server runs continuous batching \
             (batching.mode = \"continuous\")",
        );
    }
    let kind: StrategyKind = match name.parse() {
        Ok(k) => k,
        Err(e) => {
            return Response::error(Status::BadRequest, "unknown_strategy", format!("{e}"));
        }
    };
    match ctx.handle.set_strategy(kind) {
        Ok(()) => {
            tracing::info!(strategy = kind.as_str(), "strategy switched via admin API");
            let body = serde_json::json!({ "strategy": kind.as_str() });
            Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default())
        }
        Err(e) => error_response(&e),
    }
}

/// The body of `POST /admin/faults`: a key left out keeps its current value; an unknown
/// key is refused (by [`front_faults`], which gets every key not named here).
#[derive(serde::Deserialize)]
struct FaultsBody {
    error_rate: Option<f64>,
    hang_rate: Option<f64>,
    hang_ms: Option<f64>,
    added_latency_ms: Option<f64>,
    /// Failures by kind (`api::faults`): any of its keys, merged over the current ones.
    #[serde(flatten)]
    front: serde_json::Map<String, serde_json::Value>,
}

fn faults_json(ctx: &ApiContext, f: FaultSettings) -> Response {
    let mut body = serde_json::json!({
        "error_rate": f.error_rate,
        "hang_rate": f.hang_rate,
        "hang_ms": f.hang_ms,
        "added_latency_ms": f.added_latency_ms,
    });
    if let Ok(serde_json::Value::Object(front)) = serde_json::to_value(ctx.faults.get()) {
        if let Some(b) = body.as_object_mut() {
            b.extend(front);
        }
    }
    body["injected"] = ctx.faults.injected();
    Response::json(Status::Ok, serde_json::to_vec(&body).unwrap_or_default())
}

/// The failures by kind with `keys` merged over the current ones, checked.
fn front_faults(
    ctx: &ApiContext,
    keys: serde_json::Map<String, serde_json::Value>,
) -> Result<crate::api::faults::FrontFaultSettings, String> {
    let mut merged = match serde_json::to_value(ctx.faults.get()) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    for (k, v) in keys {
        if !merged.contains_key(&k) {
            return Err(format!("unknown field '{k}'"));
        }
        merged.insert(k, v);
    }
    let s: crate::api::faults::FrontFaultSettings =
        serde_json::from_value(serde_json::Value::Object(merged)).map_err(|e| e.to_string())?;
    s.check()?;
    Ok(s)
}

/// `GET /admin/faults` shows, `POST /admin/faults` changes, the faults every `sim` worker
/// injects (the `[workers] fault_*` keys) while the server runs: chaos runs switch them on
/// and off under load. Values are checked like the config's; nothing changes on a refusal.
fn admin_faults(ctx: &ApiContext, head: &Head, body: &[u8]) -> Response {
    let current = ctx.handle.faults(0).unwrap_or_default();
    match head.method {
        Method::Get | Method::Head => return faults_json(ctx, current),
        Method::Post => {}
        _ => {
            return Response::error(
                Status::MethodNotAllowed,
                "method_not_allowed",
                "/admin/faults supports GET and POST",
            )
            .with_header("Allow: GET, HEAD, POST")
        }
    }
    let b: FaultsBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => {
            return Response::error(
                Status::BadRequest,
                "invalid_faults",
                format!(
                    "POST /admin/faults takes a JSON object with any of error_rate, hang_rate \
                     (0..=1), hang_ms, added_latency_ms (>= 0) and the failures by kind \
                     (docs/endpoints.md): {e}"
                ),
            )
        }
    };
    let front = match front_faults(ctx, b.front) {
        Ok(f) => f,
        Err(e) => return Response::error(Status::BadRequest, "invalid_faults", e),
    };
    let next = FaultSettings {
        error_rate: b.error_rate.unwrap_or(current.error_rate),
        hang_rate: b.hang_rate.unwrap_or(current.hang_rate),
        hang_ms: b.hang_ms.unwrap_or(current.hang_ms),
        added_latency_ms: b.added_latency_ms.unwrap_or(current.added_latency_ms),
    };
    let checks = [
        ("error_rate", next.error_rate, 1.0),
        ("hang_rate", next.hang_rate, 1.0),
        ("hang_ms", next.hang_ms, f64::MAX),
        ("added_latency_ms", next.added_latency_ms, f64::MAX),
    ];
    for (key, value, max) in checks {
        if !(0.0..=max).contains(&value) {
            let range = if max == 1.0 { "0..=1" } else { ">= 0" };
            return Response::error(
                Status::BadRequest,
                "invalid_faults",
                format!("{key} must be {range}, got {value}"),
            );
        }
    }
    ctx.handle.set_faults_all(next);
    ctx.faults.set(front);
    tracing::info!(
        error_rate = next.error_rate,
        hang_rate = next.hang_rate,
        hang_ms = next.hang_ms,
        added_latency_ms = next.added_latency_ms,
        "faults switched via admin API"
    );
    faults_json(ctx, next)
}
