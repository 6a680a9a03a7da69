//! The OpenAI-compatible API: routes a parsed request to an immediate response or to a
//! [`Job`] of engine requests, and renders a job's outcomes as OpenAI JSON.
//!
//! Runs on io threads. It may allocate and parse; it must never block (the only calls into
//! the runtime are non-blocking: snapshot reads, strategy control pushes).
//!
//! A request's fields travel one way: [`wire`] declares the bodies (the fields both text
//! endpoints accept are declared once, in [`wire::GenerationBody`]); [`payload`] checks
//! them and builds the payload the worker gets ([`crate::exec::Work`], sampling settings
//! grouped in [`crate::exec::Sampling`]) once; the endpoints here resolve the model and wrap
//! each payload in a [`Request`] with its priority and route, and the runtime moves it to
//! the worker as is. A new OpenAI sampling field touches `wire`, `payload`, `Sampling` and
//! the executor that uses it; nothing else. The `/admin/*` control endpoints live in
//! [`admin`].

pub mod admin;
pub mod admin_backends;
pub mod body_scan;
pub mod chat;
pub mod deferred;
pub mod faults;
pub mod json_out;
pub mod logprobs;
pub mod lora;
pub mod payload;
pub mod render;
pub mod response_object;
pub mod responses;
pub mod schema_gen;
pub mod stream;
pub mod structured;
pub mod tokenize;
pub mod wire;

use crate::config::Config;
use crate::core::{FailReason, Reject};
use crate::exec::ExecError;
use crate::http::parse::{Head, Method};
use crate::http::response::{Response, Status};
use crate::metrics::http_stats::HttpStats;
use crate::router::{RequirementsBuilder, RouteError, Router};
use crate::runtime::{Handle, Request, RequestError, RouteRequest};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use wire::{BodyError, ChatBody, CompletionBody, EmbeddingBody};

/// What the io threads share to answer requests. Cloned (cheaply: shared parts are `Arc`s)
/// only when the router copy changes ([`ApiContext::refreshed`]).
#[derive(Clone)]
pub struct ApiContext {
    pub handle: Arc<Handle>,
    pub config: Arc<Config>,
    pub http_stats: Arc<HttpStats>,
    /// A read-only copy of the engine's router (same backends and names, built from the
    /// same config): resolves model names and judges static routing errors on the io
    /// thread, names backends in the `x-abe-route` header, lists `/v1/models`.
    pub router: Arc<Router>,
    /// The model a request without `model` gets (shared by every job that names it).
    pub default_model: Arc<str>,
    /// Some backend is `upstream`: chat requests keep their JSON body to forward.
    pub has_upstream: bool,
    /// The per-second history (`/metrics/history`, windowed rates in `/metrics/json`),
    /// filled by the history thread `serve` starts.
    pub history: Arc<crate::metrics::history::History>,
    /// `/events` subscribers, fed by the events thread `serve` starts.
    pub events: Arc<crate::metrics::events::EventHub>,
    /// Padding and forward counters of each `embed` backend (by name), for `/metrics`.
    pub embed_stats: Vec<(Box<str>, Arc<crate::exec::embed::EmbedStats>)>,
    /// Failures by kind injected in front of the engine (`[workers] fault_*`).
    pub faults: Arc<faults::FrontFaults>,
    /// `POST /v1/responses` answers kept for `GET /v1/responses/{id}` (bounded).
    pub responses: Arc<response_object::ResponseStore>,
    /// The backend slots' control plane (`/admin/backends`, `/admin/reload`); `None` for a
    /// context built without `serve`.
    pub live: Option<Arc<crate::live::LiveBackends>>,
    /// Which of `live`'s router copies `router` is (see [`ApiContext::refreshed`]).
    pub router_generation: u64,
    /// LoRA adapters by name (`lora`: `/v1/load_lora_adapter`, `/v1/unload_lora_adapter`).
    pub lora: Arc<crate::router::lora::LoraTable>,
}

impl ApiContext {
    /// The context for a running handle and a validated config.
    pub fn new(
        handle: Arc<Handle>,
        config: Arc<Config>,
        http_stats: Arc<HttpStats>,
        router: Arc<Router>,
    ) -> ApiContext {
        let default_model = ApiContext::default_model_for(&config, &router).into();
        let has_upstream = router
            .registry()
            .backends()
            .any(|(_, b)| matches!(b.kind(), crate::router::BackendKind::Upstream { .. }));
        let retention_s = (config.metrics.history_retention.0 / 1000) as usize;
        let lora = Arc::new(lora_table(&config));
        let faults = Arc::new(faults::FrontFaults::new(
            faults::FrontFaultSettings::from_config(&config.workers),
            config.workers.seed,
        ));
        ApiContext {
            handle,
            config,
            http_stats,
            router,
            default_model,
            has_upstream,
            history: Arc::new(crate::metrics::history::History::new(retention_s)),
            events: Arc::default(),
            embed_stats: Vec::new(),
            faults,
            responses: Arc::default(),
            live: None,
            router_generation: 0,
            lora,
        }
    }

    /// This context with the router copy the control plane published last, when it is not
    /// the one held (a spare slot filled, aliases or fallbacks reloaded: `live`); `None`
    /// otherwise. An io thread calls it once per turn: one atomic load when nothing moved.
    pub fn refreshed(&self) -> Option<ApiContext> {
        let live = self.live.as_ref()?;
        let (generation, router) = live.io_router_if_newer(self.router_generation)?;
        let mut ctx = self.clone();
        ctx.default_model = Arc::from(ApiContext::default_model_for(&ctx.config, &router));
        ctx.router = router;
        ctx.router_generation = generation;
        Some(ctx)
    }

    /// The model requests without `model` get: `server.model_name` when some backend
    /// serves it, else the first model of the first backend.
    pub fn default_model_for(config: &Config, router: &Router) -> String {
        let served = router
            .resolver()
            .lookup(&config.server.model_name)
            .and_then(|n| router.resolver().served(n))
            .is_some();
        if served {
            return config.server.model_name.clone();
        }
        router
            .registry()
            .backends()
            .next()
            .and_then(|(_, b)| b.models().first().copied())
            .map(|m| router.registry().model_name(m).to_string())
            .unwrap_or_else(|| config.server.model_name.clone())
    }
}

/// What decoding a request for `/v1/completions`, `/v1/chat/completions` or
/// `/v1/embeddings` reads: the config, the router and the default model, nothing of the
/// runtime. Borrowed from an [`ApiContext`] by the server; built on its own by the
/// coverage-guided fuzz targets (`fuzz/`), which decode bodies without starting one.
pub struct Decoder<'a> {
    pub config: &'a Config,
    pub router: &'a Router,
    /// The model a request without `model` gets ([`ApiContext::default_model_for`]).
    pub default_model: &'a Arc<str>,
    /// Some backend is `upstream`: chat requests keep their JSON body to forward.
    pub has_upstream: bool,
    /// LoRA adapters a request may name as its `model` (`None`: none).
    pub lora: Option<&'a crate::router::lora::LoraTable>,
    /// The Responses API's store, for `previous_response_id` (`None`: none kept).
    pub responses: Option<&'a response_object::ResponseStore>,
}

/// The adapters `config`'s models list (checked by `Config::check`; a config that was not
/// gets an empty table).
fn lora_table(config: &Config) -> crate::router::lora::LoraTable {
    crate::router::lora::LoraTable::from_backends(
        config.lora.max_lora_adapters,
        &config.effective_backends(),
    )
    .unwrap_or_else(|_| crate::router::lora::LoraTable::empty())
}

impl ApiContext {
    /// The decoding part of this context.
    pub fn decoder(&self) -> Decoder<'_> {
        Decoder {
            config: &self.config,
            router: &self.router,
            default_model: &self.default_model,
            has_upstream: self.has_upstream,
            lora: Some(&self.lora),
            responses: Some(&self.responses),
        }
    }
}

impl Decoder<'_> {
    /// Decodes a `POST` to one of the three generation endpoints (`head.path`; any other
    /// path is taken for `/v1/embeddings`): a [`Job`] to submit, or the 4xx answer saying
    /// what is wrong with the body. Never blocks, never touches the runtime.
    pub fn decode(&self, head: &Head, body: &[u8]) -> Routed {
        let routed = match head.path.as_str() {
            "/v1/completions" => completions(self, head, body),
            "/v1/chat/completions" => chat_completions(self, head, body),
            "/v1/responses" => responses::decode(self, head, body),
            _ => embeddings(self, head, body),
        };
        routed.unwrap_or_else(|r| r)
    }
}

/// What a request turns into.
pub enum Routed {
    /// Answer now.
    Now(Response),
    /// Submit these engine requests; render the answer when all are back. Not boxed: a
    /// [`Job`] is kept small (its rare parts sit in one optional box, [`JobExtras`]), so
    /// the usual generation request allocates nothing for it.
    Submit(Job),
    /// `GET /events`: stream this subscriber's telemetry until the connection closes.
    Subscribe(Arc<crate::metrics::events::Subscriber>),
    /// Answer once another thread filled this (`POST /admin/reload`).
    Later(Arc<deferred::Deferred>),
}

/// How to render a job's outcomes.
#[derive(Clone, Debug)]
pub enum JobKind {
    Completion,
    Chat,
    Embedding {
        base64: bool,
    },
    /// `POST /v1/responses`; `store`: kept for `GET /v1/responses/{id}`.
    Response {
        store: bool,
    },
}

/// Engine requests from one HTTP request, and how to answer once they are done.
///
/// Moved by value per request (decoded, checked for faults, parked in the connection's
/// slot), so it stays small: what only some requests have lives in [`JobExtras`], boxed
/// on first use ([`Job::extras_mut`]); the usual request (no stream, no echo, no request
/// id, plain text) never allocates it. A field every request needs goes here; anything
/// else goes in [`JobExtras`]. `JOB_BYTES_MAX` below holds the size.
pub struct Job {
    pub kind: JobKind,
    /// The model named in the answer: the client's name, shared with the context's
    /// default model when it is that one (no allocation).
    pub model: Arc<str>,
    pub requests: Vec<Request>,
    pub created_unix: u64,
    /// Choices per prompt and log-probabilities (text jobs).
    pub choices: stream::ChoiceOptions,
    /// The rare parts; `None` for a plain request.
    pub extras: Option<Box<JobExtras>>,
}

/// What only some jobs have, kept out of [`Job`] so the usual job moves small and
/// allocates nothing for it.
#[derive(Default)]
pub struct JobExtras {
    /// Answer as a Server-Sent Events stream (`stream: true`).
    pub stream: Option<stream::StreamOptions>,
    /// Completions with `echo`: each prompt, prepended to its choices' text.
    pub echo: Option<Vec<Arc<str>>>,
    /// The client's `X-Request-Id`: echoed, and the response's id (`cmpl-<id>`, as vLLM).
    pub request_id: Option<Arc<str>>,
    /// Tools and structured output: each part's shape, written in place of its words.
    pub structured: Option<Arc<[structured::Shape]>>,
    /// `POST /v1/responses`: what its JSON repeats, and its store.
    pub response: Option<Arc<response_object::ResponseMeta>>,
}

/// Most bytes of a [`Job`]: a `Result<Routed, Routed>` stays under clippy's
/// `result_large_err` threshold (128) and a job moves in two cache lines.
const JOB_BYTES_MAX: usize = 96;
const _: () = assert!(std::mem::size_of::<Job>() <= JOB_BYTES_MAX);

impl Job {
    /// A job of `requests`, created now, with no extras.
    pub fn new(kind: JobKind, model: Arc<str>, mut requests: Vec<Request>) -> Job {
        // A LoRA adapter's requests ask an upstream backend for the adapter by name.
        for r in &mut requests {
            if r.route
                .is_some_and(|route| route.need.adapter != crate::core::lora::BASE_MODEL)
            {
                r.work.model = Some(model.clone());
            }
        }
        Job {
            kind,
            model,
            requests,
            created_unix: unix_now(),
            choices: stream::ChoiceOptions::default(),
            extras: None,
        }
    }

    /// The extras, boxed now if this job had none.
    pub fn extras_mut(&mut self) -> &mut JobExtras {
        self.extras.get_or_insert_with(Box::default)
    }

    /// Sets the stream options (boxing the extras only for a stream).
    pub fn with_stream(mut self, stream: Option<stream::StreamOptions>) -> Job {
        if stream.is_some() {
            self.extras_mut().stream = stream;
        }
        self
    }

    /// Sets the client's `X-Request-Id` (boxing the extras only when there is one).
    pub fn with_request_id(mut self, request_id: Option<&str>) -> Job {
        if let Some(id) = request_id {
            self.extras_mut().request_id = Some(Arc::from(id));
        }
        self
    }

    /// Sets the tools / structured output shapes (boxing the extras only when there are).
    pub fn with_structured(mut self, structured: Option<Arc<[structured::Shape]>>) -> Job {
        if structured.is_some() {
            self.extras_mut().structured = structured;
        }
        self
    }

    pub fn stream(&self) -> Option<&stream::StreamOptions> {
        self.extras.as_ref()?.stream.as_ref()
    }

    pub fn stream_mut(&mut self) -> Option<&mut stream::StreamOptions> {
        self.extras.as_mut()?.stream.as_mut()
    }

    pub fn echo(&self) -> Option<&[Arc<str>]> {
        self.extras.as_ref()?.echo.as_deref()
    }

    pub fn request_id(&self) -> Option<&Arc<str>> {
        self.extras.as_ref()?.request_id.as_ref()
    }

    pub fn structured(&self) -> Option<&Arc<[structured::Shape]>> {
        self.extras.as_ref()?.structured.as_ref()
    }

    pub fn response(&self) -> Option<&Arc<response_object::ResponseMeta>> {
        self.extras.as_ref()?.response.as_ref()
    }
}

/// Seconds since the Unix epoch (the `created` of every answer).
///
/// On Linux, `CLOCK_REALTIME_COARSE`: the kernel's last tick, read without a syscall and
/// without `SystemTime`'s checked subtraction (~84 instructions a request on the io thread
/// before, callgrind). It lags the precise clock by at most a tick (1-4 ms), so a `created`
/// is at most one second behind for a few milliseconds a second; it never runs ahead.
pub fn unix_now() -> u64 {
    // The clock exists since Linux 2.6.32; if refused, the precise clock below.
    #[cfg(target_os = "linux")]
    if let Some(ts) = crate::runtime::clock::clock_gettime(libc::CLOCK_REALTIME_COARSE) {
        return u64::try_from(ts.tv_sec).unwrap_or(0);
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The HTTP error for an engine outcome error.
pub fn error_response(e: &RequestError) -> Response {
    let (status, code) = match e {
        RequestError::Busy => (Status::TooManyRequests, "engine_busy"),
        RequestError::Rejected(Reject::QueueFull { .. }) => (Status::TooManyRequests, "queue_full"),
        RequestError::Rejected(Reject::TooLarge { .. }) => {
            (Status::BadRequest, "request_too_large")
        }
        RequestError::Rejected(Reject::ShuttingDown) | RequestError::ShuttingDown => {
            (Status::ServiceUnavailable, "shutting_down")
        }
        RequestError::Failed(FailReason::QueueTimeout) => {
            (Status::ServiceUnavailable, "queue_timeout")
        }
        RequestError::Failed(FailReason::BatchTimeout) => (Status::GatewayTimeout, "batch_timeout"),
        RequestError::Failed(FailReason::WorkerError) | RequestError::Worker(_) => {
            (Status::InternalError, "worker_error")
        }
        RequestError::Failed(FailReason::Cancelled) => (Status::BadRequest, "cancelled"),
        RequestError::Failed(FailReason::Aborted) => (Status::ServiceUnavailable, "aborted"),
        RequestError::Backend(ExecError::Invalid { .. }) => {
            (Status::BadRequest, "invalid_request_error")
        }
        RequestError::Backend(b) => match b.http_status() {
            504 => (Status::GatewayTimeout, "upstream_timeout"),
            503 => (Status::ServiceUnavailable, "backend_unavailable"),
            502 => (Status::BadGateway, "upstream_error"),
            500 => (Status::InternalError, "worker_error"),
            code => (client_status(code), "upstream_rejected"),
        },
        RequestError::Route(r) => return route_error(r),
    };
    Response::error(status, code, e.to_string())
}

/// The response for a routing error (404 unknown model, 400 capability, 503 unavailable).
pub fn route_error(e: &RouteError) -> Response {
    let status = match e.status() {
        404 => Status::NotFound,
        400 => Status::BadRequest,
        _ => Status::ServiceUnavailable,
    };
    Response::error(status, e.code(), e.to_string())
}

/// The closest status abe speaks for a backend's 4xx.
fn client_status(code: u16) -> Status {
    match code {
        401 | 403 => Status::Unauthorized,
        404 => Status::NotFound,
        413 => Status::PayloadTooLarge,
        429 => Status::TooManyRequests,
        _ => Status::BadRequest,
    }
}

fn bad(e: BodyError) -> Routed {
    Routed::Now(Response::error(Status::BadRequest, e.code, e.message))
}

/// Routes one request.
pub fn route(ctx: &ApiContext, head: &Head, body: &[u8]) -> Routed {
    let path = head.path.as_str();
    let allow = |allowed: &'static str| {
        Routed::Now(
            Response::error(
                Status::MethodNotAllowed,
                "method_not_allowed",
                format!("{path} supports {allowed} only"),
            )
            .with_header(format!("Allow: {allowed}")),
        )
    };
    let is_get = matches!(head.method, Method::Get | Method::Head);
    match path {
        "/v1/completions" | "/v1/chat/completions" | "/v1/embeddings" | "/v1/responses" => {
            // Every answer to a generation request echoes its `X-Request-Id` (vLLM does).
            let routed = if head.method != Method::Post {
                allow("POST")
            } else if !ctx.handle.is_accepting() {
                Routed::Now(Response::error(
                    Status::ServiceUnavailable,
                    "shutting_down",
                    "the server is shutting down and no longer accepts requests",
                ))
            } else {
                let mut routed = ctx.decoder().decode(head, body);
                faults::inject(&ctx.faults, &mut routed);
                responses::attach_store(&ctx.responses, &mut routed);
                routed
            };
            match (routed, head.request_id.as_deref()) {
                (Routed::Now(mut r), Some(id)) => {
                    r.echo_request_id(id);
                    Routed::Now(r)
                }
                (routed, _) => routed,
            }
        }
        p if p.starts_with("/v1/responses/") && is_get => Routed::Now(response_object::get(
            &ctx.responses,
            &p["/v1/responses/".len()..],
        )),
        "/version" if is_get => Routed::Now(Response::json(
            Status::Ok,
            serde_json::to_vec(&serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }))
                .unwrap_or_default(),
        )),
        "/v1/models" if is_get => Routed::Now(render::models(
            &ctx.router,
            lora::model_cards(&ctx.lora),
        )),
        "/v1/load_lora_adapter" | "/v1/unload_lora_adapter" => {
            Routed::Now(lora::endpoint(ctx, head, path, body))
        }
        "/health" if is_get => {
            Routed::Now(Response::json(Status::Ok, br#"{"status":"ok"}"#.to_vec()))
        }
        "/ready" if is_get => {
            if ctx.handle.is_accepting() {
                Routed::Now(Response::json(
                    Status::Ok,
                    br#"{"status":"ready"}"#.to_vec(),
                ))
            } else {
                Routed::Now(Response::error(
                    Status::ServiceUnavailable,
                    "not_ready",
                    "the server is shutting down",
                ))
            }
        }
        "/metrics" if is_get => {
            let snap = ctx.handle.snapshot();
            let mut out = String::with_capacity(16 * 1024);
            crate::metrics::prometheus::render(&snap, &ctx.http_stats, &mut out);
            crate::metrics::prometheus::render_embed(&ctx.embed_stats, &mut out);
            crate::metrics::events::render_prometheus(
                &ctx.events,
                ctx.handle.telemetry_lost(),
                &mut out,
            );
            crate::metrics::vllm::render(&snap, &ctx.default_model, &mut out);
            crate::metrics::vllm::render_lora(
                &snap,
                ctx.config.lora.max_loras,
                ctx.lora.capacity() > 0 && !ctx.lora.list().is_empty(),
                |id| ctx.lora.name_of(id),
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
                &mut out,
            );
            Routed::Now(Response::text(
                Status::Ok,
                "text/plain; version=0.0.4; charset=utf-8",
                out.into_bytes(),
            ))
        }
        "/metrics/json" if is_get => {
            let snap = ctx.handle.snapshot();
            let now_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            let mut v = crate::metrics::json::render(&snap, &ctx.http_stats, now_ms);
            v["windows"] = serde_json::json!({
                "1s": ctx.history.window(1),
                "10s": ctx.history.window(10),
            });
            Routed::Now(Response::json(
                Status::Ok,
                serde_json::to_vec(&v).unwrap_or_default(),
            ))
        }
        "/metrics/history" if is_get => Routed::Now(metrics_history(ctx, head)),
        "/tokenize" | "/detokenize" if head.method == Method::Post => {
            let result = if path == "/tokenize" {
                tokenize::tokenize(body, ctx.config.server.max_model_len)
            } else {
                tokenize::detokenize(body)
            };
            match result {
                Ok(v) => Routed::Now(Response::json(
                    Status::Ok,
                    serde_json::to_vec(&v).unwrap_or_default(),
                )),
                Err(e) => bad(e),
            }
        }
        "/tokenize" | "/detokenize" => allow("POST"),
        "/events" if head.method == Method::Get => match ctx.events.subscribe() {
            Some(subscriber) => Routed::Subscribe(subscriber),
            None => Routed::Now(Response::error(
                Status::ServiceUnavailable,
                "too_many_subscribers",
                format!(
                    "/events has its {} subscribers already; retry later",
                    crate::metrics::events::MAX_SUBSCRIBERS
                ),
            )),
        },
        "/events" => allow("GET"),
        p if p == "/" || p == "/dashboard" || p.starts_with("/dashboard/") => {
            match (is_get, crate::dashboard::asset(p)) {
                (true, Some(response)) => Routed::Now(response),
                (false, Some(_)) => allow("GET, HEAD"),
                (_, None) => Routed::Now(Response::error(
                    Status::NotFound,
                    "not_found",
                    format!("no such dashboard asset: {p}"),
                )),
            }
        }
        "/v1/models" | "/health" | "/ready" | "/version" | "/metrics" | "/metrics/json"
        | "/metrics/history" => {
            allow("GET, HEAD")
        }
        p if p.starts_with("/admin/") => admin::route(ctx, head, p, body),
        _ => Routed::Now(Response::error(
            Status::NotFound,
            "not_found",
            format!(
                "no such endpoint: {path}; endpoints are /v1/completions, \
                 /v1/chat/completions, /v1/responses, /v1/embeddings, /v1/models, /v1/load_lora_adapter, /v1/unload_lora_adapter, /version, /metrics, /metrics/json, /metrics/history, /events, /dashboard, /tokenize, /detokenize, /health, /ready, /admin/strategy/{{name}}, /admin/faults"
            ),
        )),
    }
}

/// `GET /metrics/history?seconds=N`: the newest N seconds of history (all kept if absent).
fn metrics_history(ctx: &ApiContext, head: &Head) -> Response {
    let mut seconds = None;
    for pair in head.query.as_deref().unwrap_or("").split('&') {
        if let Some(v) = pair.strip_prefix("seconds=") {
            match v.parse::<usize>() {
                Ok(n) => seconds = Some(n),
                Err(_) => {
                    return Response::error(
                        Status::BadRequest,
                        "invalid_parameter",
                        format!("seconds must be a whole number of seconds, not '{v}'"),
                    )
                }
            }
        }
    }
    let v = ctx.history.render(seconds);
    Response::json(Status::Ok, serde_json::to_vec(&v).unwrap_or_default())
}

/// The model a request names, or the default.
fn model_of<'a>(ctx: &'a Decoder<'_>, model: Option<&'a str>) -> &'a str {
    model.unwrap_or(ctx.default_model)
}

/// The model a job answers with: the default's shared name when the request names it or
/// none (the usual case: no allocation), else a copy of the name given.
fn job_model(ctx: &Decoder<'_>, model: &str) -> Arc<str> {
    if model == &**ctx.default_model {
        ctx.default_model.clone()
    } else {
        Arc::from(model)
    }
}

/// `model` (see [`model_of`]) checked against the router: unknown models (404), empty names
/// and capability mismatches (400) are answered here, before anything reaches the engine.
/// `needs` adds what the request asks for: its text (for the size estimate) and any
/// capabilities.
fn check_model<'a>(
    ctx: &Decoder<'_>,
    model: &'a str,
    needs: impl FnOnce(&mut RequirementsBuilder<'a>),
) -> Result<RouteRequest, Routed> {
    let mut b = RequirementsBuilder::new(model);
    needs(&mut b);
    let req = b.build();
    match ctx.router.precheck(&req) {
        Ok((name, need)) => Ok(RouteRequest {
            name,
            need,
            session: None,
        }),
        Err(e @ RouteError::ModelNotFound { .. }) => {
            // Not a model: a LoRA adapter runs on its base model (cold for base requests).
            let Some(adapter) = ctx.lora.and_then(|t| t.lookup(model)) else {
                return Err(Routed::Now(route_error(&e)));
            };
            let base = crate::router::Requirements {
                model: &adapter.base,
                adapter: adapter.id,
                ..req
            };
            match ctx.router.precheck(&base) {
                Ok((name, need)) => Ok(RouteRequest {
                    name,
                    need,
                    session: None,
                }),
                Err(e) => Err(Routed::Now(route_error(&e))),
            }
        }
        Err(e) => Err(Routed::Now(route_error(&e))),
    }
}

/// Where a text request of `head` comes from, for [`payload::text`].
fn text_source<'a>(
    ctx: &Decoder<'_>,
    head: &'a Head,
    max_tokens_field: &'a str,
    priority: Option<&'a str>,
) -> payload::TextSource<'a> {
    payload::TextSource {
        max_tokens_field,
        priority,
        priority_header: head.priority.as_deref(),
        http10: head.http10,
        max_tokens_limit: ctx.config.server.max_tokens_limit,
    }
}

fn completions(ctx: &Decoder<'_>, head: &Head, body: &[u8]) -> Result<Routed, Routed> {
    let mut b: CompletionBody = body_scan::completion_body(body).map_err(bad)?;
    let session = session_of(head, b.user.as_deref());
    let generation = b.generation();
    let explicit_max = generation.max_tokens.is_some();
    let plan = structured::plan(&structured::Asks {
        response_format: b.response_format.as_deref(),
        guided_json: b.guided_json.as_deref(),
        guided_choice: b.guided_choice.as_deref().map(Vec::as_slice),
        guided_regex: b.guided_regex.is_some(),
        structured_outputs: b.structured_outputs.as_deref(),
        ..Default::default()
    })
    .map_err(bad)?;
    let source = text_source(ctx, head, "max_tokens", b.priority.as_deref());
    let mut text = payload::text(source, generation).map_err(bad)?;
    let logprobs = match b.logprobs {
        None => None,
        Some(k) if (0..=i64::from(logprobs::COMPLETION_TOP_MAX)).contains(&k) => Some(k as u8),
        Some(k) => {
            return Err(bad(wire::body_error(
                "invalid_value",
                format!(
                    "'logprobs' must be between 0 and {}, got {k}",
                    logprobs::COMPLETION_TOP_MAX
                ),
            )))
        }
    };
    let echo = b.echo == Some(true);
    let prompts =
        wire::inputs("prompt", b.prompt, ctx.config.server.max_batch_inputs).map_err(bad)?;
    let max_inputs = ctx.config.server.max_batch_inputs;
    if prompts.len() * text.n as usize > max_inputs {
        return Err(bad(wire::body_error(
            "invalid_value",
            format!(
                "{} prompts x n = {} choices exceeds server.max_batch_inputs ({max_inputs})",
                prompts.len(),
                text.n
            ),
        )));
    }
    let model = model_of(ctx, b.model.as_deref());
    let choices = stream::ChoiceOptions {
        n: text.n,
        logprobs,
    };
    if let Some(s) = text.stream.as_mut() {
        s.choices = choices;
    }
    let mut requests = Vec::with_capacity(prompts.len() * text.n as usize);
    let mut echoed = Vec::new();
    if let Some(usage) = text
        .stream
        .as_mut()
        .and_then(|s| s.continuous_usage.as_mut())
    {
        *usage = prompts
            .iter()
            .map(|p| u64::from(crate::exec::prompt_tokens(p)))
            .sum();
    }
    for prompt in prompts {
        let mut route = check_model(ctx, model, |r| {
            r.text(&prompt);
        })?;
        route.session = session;
        check_model_len(ctx, &prompt, &text)?;
        let mut work = text.work(Arc::from(&*prompt), None);
        name_prompt_blocks(ctx, &mut work, route.need.adapter);
        if echo {
            echoed.push(work.prompt.clone());
        }
        for work in payload::Text::choices(work, text.n) {
            requests.push(Request {
                priority: text.priority,
                route: Some(route),
                work,
            });
        }
    }
    let model = job_model(ctx, model);
    let structured = shape_parts(ctx, plan.as_ref(), &mut requests, explicit_max)?;
    let mut job = Job::new(JobKind::Completion, model, requests)
        .with_stream(text.stream)
        .with_request_id(head.request_id.as_deref())
        .with_structured(structured);
    job.choices = choices;
    if echo {
        job.extras_mut().echo = Some(echoed);
    }
    Ok(Routed::Submit(job))
}

/// vLLM's 400 when prompt + max_tokens exceed `server.max_model_len` (0: no limit).
/// Names the prompt's full KV blocks whenever something uses the names: the scheduler when
/// it caches prefixes (continuous batching with `continuous.prefix_caching`), the router
/// when it routes by them (`routing.strategy = "prefix_aware"`, in either mode: for an
/// `upstream` backend its approximate index records them). Done here, on the io thread, so
/// the engine only looks names up. The rendered text is named (after the chat template),
/// so a conversation sent again with its history finds its earlier turns. A LoRA
/// `adapter`'s names are its own (`core::prefix::root_for_load`): no KV shared across
/// adapters, nor with an earlier adapter of the same id.
fn name_prompt_blocks(
    ctx: &Decoder<'_>,
    work: &mut crate::exec::Work,
    adapter: crate::core::lora::AdapterId,
) {
    let c = &ctx.config.continuous;
    let caching =
        ctx.config.batching.mode == crate::core::BatchingMode::Continuous && c.prefix_caching;
    let routing = ctx.router.strategy() == crate::router::Strategy::PrefixAware;
    if !caching && !routing {
        return;
    }
    // An adapter loaded under a freed id names its blocks apart from the id's earlier
    // adapters' (`root_for_load`); the base model (and an id unloaded meanwhile) under 0.
    let load = match adapter {
        crate::core::lora::BASE_MODEL => 0,
        id => ctx.lora.and_then(|t| t.load_of(id)).unwrap_or(0),
    };
    let mut names = Vec::with_capacity(work.prompt.len() / (c.kv_block_tokens.max(1) as usize * 4));
    crate::core::prefix::adapter_text_block_hashes(
        &work.prompt,
        c.kv_block_tokens,
        adapter,
        load,
        &mut names,
    );
    if !names.is_empty() {
        work.prompt_blocks = Some(names.into());
    }
}

/// A request's session key for `session` routing: the `X-Session-Id` header, else the
/// OpenAI `user` field, hashed ([`crate::router::affinity::session_key`]); `None` without
/// either (or with an empty one).
fn session_of(head: &Head, user: Option<&str>) -> Option<u64> {
    head.session_id
        .as_deref()
        .or(user)
        .filter(|id| !id.is_empty())
        .map(crate::router::affinity::session_key)
}

fn check_model_len(ctx: &Decoder<'_>, prompt: &str, text: &payload::Text) -> Result<(), Routed> {
    let limit = ctx.config.server.max_model_len;
    if limit == 0 {
        return Ok(());
    }
    let prompt_tokens = crate::exec::prompt_tokens(prompt);
    let max_tokens = text.max_tokens();
    let total = u64::from(prompt_tokens) + u64::from(max_tokens);
    if total > u64::from(limit) {
        return Err(bad(wire::body_error(
            "context_length_exceeded",
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested \
                 {total} tokens ({prompt_tokens} in the messages, {max_tokens} in the \
                 completion). Please reduce the length of the messages or completion."
            ),
        )));
    }
    Ok(())
}

fn chat_completions(ctx: &Decoder<'_>, head: &Head, body: &[u8]) -> Result<Routed, Routed> {
    let mut b: ChatBody = body_scan::chat_body(body).map_err(bad)?;
    let session = session_of(head, b.user.as_deref());
    let mut generation = b.generation();
    let explicit_max = generation.max_tokens.is_some() || b.max_completion_tokens.is_some();
    let plan = structured::plan(&structured::Asks {
        tools: b.tools.as_deref(),
        tool_choice: b.tool_choice.as_deref(),
        parallel_tool_calls: b.parallel_tool_calls,
        response_format: b.response_format.as_deref(),
        guided_json: b.guided_json.as_deref(),
        guided_choice: b.guided_choice.as_deref().map(Vec::as_slice),
        guided_regex: b.guided_regex.is_some(),
        structured_outputs: b.structured_outputs.as_deref(),
    })
    .map_err(bad)?;
    let field = match b.max_completion_tokens {
        Some(n) => {
            generation.max_tokens = Some(n);
            "max_completion_tokens"
        }
        None => "max_tokens",
    };
    let source = text_source(ctx, head, field, b.priority.as_deref());
    let mut text = payload::text(source, generation).map_err(bad)?;
    let logprobs = match (b.logprobs, b.top_logprobs) {
        (Some(true), None) => Some(0),
        (Some(true), Some(k)) if (0..=i64::from(logprobs::CHAT_TOP_MAX)).contains(&k) => {
            Some(k as u8)
        }
        (Some(true), Some(k)) => {
            return Err(bad(wire::body_error(
                "invalid_value",
                format!(
                    "'top_logprobs' must be between 0 and {}, got {k}",
                    logprobs::CHAT_TOP_MAX
                ),
            )))
        }
        (_, Some(_)) => {
            return Err(bad(wire::body_error(
                "invalid_value",
                "'top_logprobs' needs 'logprobs': true",
            )))
        }
        _ => None,
    };
    let choices = stream::ChoiceOptions {
        n: text.n,
        logprobs,
    };
    if let Some(s) = text.stream.as_mut() {
        s.choices = choices;
    }
    let model = model_of(ctx, b.model.as_deref());
    let mut route = check_model(ctx, model, |r| chat::needs(&b, r))?;
    route.session = session;
    let model = job_model(ctx, model);
    let chat_body = if ctx.has_upstream {
        std::str::from_utf8(body).ok().map(Arc::from)
    } else {
        None
    };
    let prompt = chat::render_prompt(b.messages).map_err(bad)?;
    check_model_len(ctx, &prompt, &text)?;
    if let Some(usage) = text
        .stream
        .as_mut()
        .and_then(|s| s.continuous_usage.as_mut())
    {
        *usage = u64::from(crate::exec::prompt_tokens(&prompt));
    }
    let mut work = text.work(prompt.into(), chat_body);
    name_prompt_blocks(ctx, &mut work, route.need.adapter);
    let mut requests: Vec<Request> = payload::Text::choices(work, text.n)
        .map(|work| Request {
            priority: text.priority,
            route: Some(route),
            work,
        })
        .collect();
    let structured = shape_parts(ctx, plan.as_ref(), &mut requests, explicit_max)?;
    let mut job = Job::new(JobKind::Chat, model, requests)
        .with_stream(text.stream)
        .with_request_id(head.request_id.as_deref())
        .with_structured(structured);
    job.choices = choices;
    Ok(Routed::Submit(job))
}

/// Tools and structured output ([`structured`]): each part's shape, drawn from its seed and
/// prompt, and its output tokens set to what the shape needs (at most an explicit
/// `max_tokens`; run to the end, so the engine's count is the shape's). Nothing when the
/// request asks for plain text, or when some backend is `upstream` (it answers tools
/// itself, from the forwarded body).
fn shape_parts(
    ctx: &Decoder<'_>,
    plan: Option<&structured::Plan>,
    requests: &mut [Request],
    explicit_max: bool,
) -> Result<Option<Arc<[structured::Shape]>>, Routed> {
    let Some(plan) = plan.filter(|_| !ctx.has_upstream) else {
        return Ok(None);
    };
    let limit = ctx.config.server.max_tokens_limit;
    let mut shapes = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter_mut().enumerate() {
        let seed = structured::seed_of(r.work.sampling.seed, &r.work.prompt, i as u32);
        let shape = structured::shape(plan, seed).map_err(bad)?;
        let needed = shape.tokens().min(limit);
        r.work.max_tokens = if explicit_max {
            r.work.max_tokens.min(needed)
        } else {
            needed
        };
        r.work.sampling.ignore_eos = true;
        r.work.sampling.min_tokens = 0;
        shapes.push(shape);
    }
    Ok(Some(shapes.into()))
}

fn embeddings(ctx: &Decoder<'_>, head: &Head, body: &[u8]) -> Result<Routed, Routed> {
    let b: EmbeddingBody = wire::parse_body(body).map_err(bad)?;
    let base64 = match b.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(bad(wire::body_error(
                "invalid_value",
                format!("'encoding_format' must be \"float\" or \"base64\", got \"{other}\""),
            )))
        }
    };
    let dimensions = payload::dimensions(b.dimensions).map_err(bad)?;
    let priority = wire::priority(b.priority.as_deref(), head.priority.as_deref()).map_err(bad)?;
    let inputs = wire::inputs("input", b.input, ctx.config.server.max_batch_inputs).map_err(bad)?;
    let model = model_of(ctx, b.model.as_deref());
    let routes = inputs
        .iter()
        .map(|input| {
            check_model(ctx, model, |r| {
                r.text(input);
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let model = job_model(ctx, model);
    let requests = inputs
        .into_iter()
        .zip(routes)
        .map(|(input, route)| Request {
            priority,
            route: Some(route),
            work: payload::embedding(&input, dimensions),
        })
        .collect();
    Ok(Routed::Submit(
        Job::new(JobKind::Embedding { base64 }, model, requests)
            .with_request_id(head.request_id.as_deref()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_now_is_the_second_of_the_precise_clock_or_the_one_before() {
        for _ in 0..1000 {
            let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
            let before = secs(SystemTime::now());
            let now = unix_now();
            let after = secs(SystemTime::now());
            // The coarse clock lags by at most a tick: never ahead, at most a second behind.
            assert!(now <= after, "{now} ahead of {after}");
            assert!(
                now + 1 >= before,
                "{now} more than a second behind {before}"
            );
        }
    }
}
