//! vLLM's LoRA endpoints: `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`) and
//! `POST /v1/unload_lora_adapter` (`{"lora_name"}`), with vLLM's answers: `200` and a
//! plain-text `Success: ...` line, or an error whose message, `type` and status are
//! vLLM's (`router::lora::LoraError`). And the adapter cards `GET /v1/models` adds.
//!
//! An adapter loaded here runs on `base_model_name` (an abe extension) or else the
//! server's default model, as vLLM's runtime loads attach to its first base model. Like
//! vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`, run-time changes are gated: they are control
//! calls, allowed when `server.admin_enabled` and with the admin token when one is set.
//! Runs on io threads. The engine sees adapter ids only; both calls tell it which id to
//! forget (a `ForgetAdapter` control, pushed before the answer): an unloaded adapter's slot
//! is freed once nothing runs there, and an id a load hands out (perhaps an unloaded
//! adapter's) starts non-resident, so its first request pays `lora_load_ms`. A request sent
//! before its load was answered may find the id's old residency (nothing orders it after
//! the control).

use super::ApiContext;
use crate::http::parse::{Head, Method};
use crate::http::response::{Response, Status};
use crate::router::lora::{LoraError, LoraTable};
use serde::Deserialize;

#[derive(Deserialize)]
struct LoadBody {
    #[serde(default)]
    lora_name: String,
    #[serde(default)]
    lora_path: String,
    /// abe extension: the model the adapter runs on (default: the server's model).
    #[serde(default)]
    base_model_name: Option<String>,
}

#[derive(Deserialize)]
struct UnloadBody {
    #[serde(default)]
    lora_name: String,
}

/// `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (`path`).
pub fn endpoint(ctx: &ApiContext, head: &Head, path: &str, body: &[u8]) -> Response {
    if head.method != Method::Post {
        return super::admin::post_only(path);
    }
    if let Some(refused) = super::admin::refuse(ctx, head) {
        return refused;
    }
    let result = if path == "/v1/load_lora_adapter" {
        load(ctx, body).map(|name| format!("Success: LoRA adapter '{name}' added successfully."))
    } else {
        unload(ctx, body)
            .map(|name| format!("Success: LoRA adapter '{name}' removed successfully."))
    };
    match result {
        Ok(text) => Response::text(Status::Ok, "text/plain; charset=utf-8", text.into_bytes()),
        Err(e) => error(&e),
    }
}

fn load(ctx: &ApiContext, body: &[u8]) -> Result<String, LoraError> {
    let b: LoadBody = serde_json::from_slice(body).map_err(|_| LoraError::MissingNameOrPath)?;
    let base = b
        .base_model_name
        .unwrap_or_else(|| ctx.default_model.to_string());
    let resolver = ctx.router.resolver();
    if resolver.lookup(&b.lora_name).is_some() {
        return Err(LoraError::NameTaken { name: b.lora_name });
    }
    if resolver
        .lookup(&base)
        .and_then(|n| resolver.served(n))
        .is_none()
    {
        return Err(LoraError::UnknownBase { base });
    }
    let id = ctx.lora.load(&b.lora_name, &b.lora_path, &base)?;
    if ctx.handle.forget_adapter(id).is_err() {
        // The engine would keep what it holds for the id: take the load back.
        let _ = ctx.lora.unload(&b.lora_name);
        return Err(LoraError::EngineBusy);
    }
    Ok(b.lora_name)
}

fn unload(ctx: &ApiContext, body: &[u8]) -> Result<String, LoraError> {
    let b: UnloadBody = serde_json::from_slice(body).map_err(|_| LoraError::MissingName)?;
    let table: &LoraTable = &ctx.lora;
    if b.lora_name.is_empty() {
        return Err(LoraError::MissingName);
    }
    let Some(adapter) = table.lookup(&b.lora_name) else {
        return Err(LoraError::NotFound(b.lora_name));
    };
    // Told first, so a refusal leaves the adapter loaded, as it was.
    ctx.handle
        .forget_adapter(adapter.id)
        .map_err(|_| LoraError::EngineBusy)?;
    table.unload(&b.lora_name)?;
    Ok(b.lora_name)
}

/// vLLM's error body: `{"error": {"message", "type", "param", "code"}}`.
fn error(e: &LoraError) -> Response {
    let status = match e.status() {
        404 => Status::NotFound,
        503 => Status::ServiceUnavailable,
        _ => Status::BadRequest,
    };
    let body = serde_json::json!({
        "error": {
            "message": e.to_string(),
            "type": e.kind(),
            "param": null,
            "code": e.status(),
        }
    });
    Response::json(status, serde_json::to_vec(&body).unwrap_or_default())
}

/// The `/v1/models` cards of the adapters, as vLLM lists them: `root` the adapter's path,
/// `parent` its base model.
pub fn model_cards(table: &LoraTable) -> Vec<serde_json::Value> {
    table
        .list()
        .into_iter()
        .map(|a| {
            serde_json::json!({
                "id": a.name,
                "object": "model",
                "created": 0,
                "owned_by": "abe",
                "root": a.path,
                "parent": a.base,
            })
        })
        .collect()
}
