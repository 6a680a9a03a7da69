// abe's dashboard: polls /metrics/history once a second, listens to /events, draws on
// <canvas> by hand (no library, no network beyond abe itself). Every chart records how
// many points it drew in its `data-points` attribute, which the browser test reads.
"use strict";

const WINDOW_S = 300;
const COLORS = ["#5ab0ff", "#6bd968", "#f5c542", "#ff6b6b", "#c792ea", "#4dd0e1", "#ff9e64", "#9aa5ce"];
const PRIORITIES = ["critical", "high", "normal", "low"];

function $(id) { return document.getElementById(id); }

// A time-series line chart on one canvas: series = [{name, points: [[t, v], ...]}].
function drawChart(canvas, series, opts) {
  opts = opts || {};
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== w * dpr || canvas.height !== h * dpr) {
    canvas.width = w * dpr; canvas.height = h * dpr;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const left = 48, right = 8, top = 18, bottom = 20;
  let tMin = Infinity, tMax = -Infinity, vMax = opts.max || 0, count = 0;
  for (const s of series) for (const [t, v] of s.points) {
    tMin = Math.min(tMin, t); tMax = Math.max(tMax, t);
    if (!opts.max) vMax = Math.max(vMax, v);
    count++;
  }
  canvas.dataset.points = String(count);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#7b8794";
  if (count === 0) {
    ctx.fillText("waiting for data…", left, top + 20);
    return;
  }
  if (tMax === tMin) tMin = tMax - 1;
  if (vMax <= 0) vMax = 1;
  vMax = niceMax(vMax);
  const x = (t) => left + (t - tMin) / (tMax - tMin) * (w - left - right);
  const y = (v) => top + (1 - v / vMax) * (h - top - bottom);
  ctx.strokeStyle = "#263040"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = vMax * i / 4, yy = y(v);
    ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(w - right, yy); ctx.stroke();
    ctx.fillText(fmt(v, opts.unit), 2, yy + 4);
  }
  const span = Math.round(tMax - tMin);
  ctx.fillText(`-${span}s`, left, h - 4);
  ctx.fillText("now", w - right - 22, h - 4);
  let lx = left;
  series.forEach((s, i) => {
    const color = s.color || COLORS[i % COLORS.length];
    ctx.strokeStyle = color; ctx.lineWidth = 1.6;
    ctx.beginPath();
    s.points.forEach(([t, v], j) => { j ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v)); });
    ctx.stroke();
    ctx.fillStyle = color;
    ctx.fillRect(lx, 4, 8, 8);
    ctx.fillStyle = "#d8dee9";
    ctx.fillText(s.name, lx + 11, 12);
    lx += 16 + ctx.measureText(s.name).width + 8;
  });
}

// An x-y chart: `line` = [[x, y], ...] drawn as a line, `points` = [[x, y], ...] as dots.
function drawXY(canvas, line, points, opts) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== w * dpr || canvas.height !== h * dpr) {
    canvas.width = w * dpr; canvas.height = h * dpr;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const left = 48, right = 8, top = 18, bottom = 20;
  canvas.dataset.points = String(line.length + points.length);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#7b8794";
  if (!line.length && !points.length) {
    ctx.fillText("waiting for data…", left, top + 20);
    return;
  }
  let xMax = 1, yMax = 0;
  for (const [px, py] of line.concat(points)) { xMax = Math.max(xMax, px); yMax = Math.max(yMax, py); }
  yMax = niceMax(yMax > 0 ? yMax : 1);
  const x = (v) => left + v / xMax * (w - left - right);
  const y = (v) => top + (1 - v / yMax) * (h - top - bottom);
  ctx.strokeStyle = "#263040"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = yMax * i / 4, yy = y(v);
    ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(w - right, yy); ctx.stroke();
    ctx.fillText(fmt(v), 2, yy + 4);
  }
  ctx.fillText("0", left, h - 4);
  ctx.fillText(opts.xLabel + " " + Math.round(xMax), w - right - 90, h - 4);
  ctx.strokeStyle = COLORS[0]; ctx.lineWidth = 1.6;
  ctx.beginPath();
  line.forEach(([px, py], j) => { j ? ctx.lineTo(x(px), y(py)) : ctx.moveTo(x(px), y(py)); });
  ctx.stroke();
  ctx.fillStyle = COLORS[2];
  for (const [px, py] of points) ctx.fillRect(x(px) - 2, y(py) - 2, 4, 4);
  ctx.fillStyle = COLORS[0]; ctx.fillRect(left, 4, 8, 8);
  ctx.fillStyle = "#d8dee9"; ctx.fillText(opts.lineName, left + 11, 12);
  const lx = left + 30 + ctx.measureText(opts.lineName).width;
  ctx.fillStyle = COLORS[2]; ctx.fillRect(lx, 4, 8, 8);
  ctx.fillStyle = "#d8dee9"; ctx.fillText(opts.pointsName, lx + 11, 12);
}

// `auto`'s state per poll, from /metrics/json: the first backend lane that runs `auto`
// (null when none does: continuous batching, or another strategy). Holds per second come
// from the change of the lane's hold count between polls.
let autoLast = null;
const autoSeen = []; // [{t, echo, holds, window}], newest last, at most WINDOW_S
function noteAuto(m) {
  autoLast = (m.backends || []).map((b) => b.auto).find((a) => a && a.decisions) || null;
  if (!autoLast) return;
  autoSeen.push({ t: Date.now() / 1000, echo: autoLast.echo_fraction, holds: autoLast.decisions.hold, window: autoLast.window_ms || 0 });
  while (autoSeen.length > WINDOW_S) autoSeen.shift();
}

// The two `auto` charts: the fitted cost a + b n + c tokens against each second's measured
// busy time per batch, both at that second's mean batch size; and the echo fraction with
// holds per second and the replayed window of a bursty open loop (ms).
function renderAuto(S, last) {
  const show = !!autoLast && !last.continuous;
  for (const el of document.querySelectorAll(".auto")) el.classList.toggle("hidden", !show);
  if (!show) return;
  const a = autoLast;
  // Per second with batches: its mean batch size n, its tokens per batch, and its busy
  // time per batch (the workers' busy share of the second over its batches).
  const perSecond = S.filter((s) => s.batch_size.batches > 0 && s.interval_s > 0).map((s) => ({
    n: s.batch_size.mean,
    tokens: ((s.prompt_tokens || 0) + (s.generation_tokens || 0)) / s.batch_size.batches,
    busy: (s.workers || []).reduce((t, w) => t + (w.utilization || 0), 0) * s.interval_s * 1000 / s.batch_size.batches,
  }));
  const measured = perSecond.map((p) => [p.n, p.busy]);
  // The fit at each second's shape: a + b n + c tokens, in order of n.
  const line = a.cost_samples > 0
    ? perSecond.map((p) => [p.n, a.cost_fixed_ms + a.cost_per_request_ms * p.n + a.cost_per_token_ms * p.tokens])
      .sort((u, v) => u[0] - v[0])
    : [];
  drawXY($("chart-auto-cost"), line, measured, { xLabel: "batch size", lineName: "fitted a + b n + c tokens", pointsName: "measured" });
  const echo = autoSeen.map((p) => [p.t, p.echo]);
  const holds = [];
  for (let i = 1; i < autoSeen.length; i++) {
    const dt = autoSeen[i].t - autoSeen[i - 1].t;
    if (dt > 0) holds.push([autoSeen[i].t, Math.max(0, autoSeen[i].holds - autoSeen[i - 1].holds) / dt]);
  }
  // One axis: the echo fraction in percent (0-100), holds per second, and the window in
  // force in ms (0 when none is).
  drawChart($("chart-auto-holds"), [
    { name: "echo %", color: COLORS[4], points: echo.map(([t, v]) => [t, v * 100]) },
    { name: "holds/s", color: COLORS[2], points: holds },
    { name: "window ms", color: COLORS[1], points: autoSeen.map((p) => [p.t, p.window]) },
  ]);
}

function niceMax(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function fmt(v, unit) {
  if (unit === "%") return (v * 100).toFixed(0) + "%";
  if (v >= 1000) return (v / 1000).toFixed(1) + "k";
  if (v >= 10 || v === 0) return v.toFixed(0);
  return v.toFixed(1);
}

function series(seconds, name, f, color) {
  return { name, color, points: seconds.map((s) => [s.uptime_s, f(s)]).filter((p) => Number.isFinite(p[1])) };
}

function rate(s, n) { return s.interval_s > 0 ? n / s.interval_s : 0; }

function sumOutcomes(s, pred) {
  let n = 0;
  for (const [k, v] of Object.entries(s.outcomes)) if (pred(k)) n += v;
  return n;
}

function render(h) {
  const S = h.seconds;
  if (!S.length) return;
  const last = S[S.length - 1];
  const recent = S.slice(-10);
  const span = recent.reduce((a, s) => a + s.interval_s, 0);
  const done = recent.reduce((a, s) => a + (s.outcomes.completed || 0), 0);
  // Continuous batching has no flush strategy: say so, and hide what only request-level has.
  $("kpi-strategy").textContent = last.continuous ? "continuous batching" : last.strategy;
  $("strategy-form").classList.toggle("hidden", !!last.continuous);
  for (const el of document.querySelectorAll(".request")) el.classList.toggle("hidden", !!last.continuous);
  $("kpi-rps").textContent = span > 0 ? (done / span).toFixed(1) : "0";
  $("kpi-p99").textContent = last.latency_ms.count ? last.latency_ms.p99.toFixed(1) + " ms" : "–";
  $("kpi-queue").textContent = String(last.queue_depth);
  $("kpi-live").textContent = String(last.live_requests);
  $("kpi-uptime").textContent = uptime(last.uptime_s);
  const sel = $("strategy-select");
  if (!sel.dataset.touched && sel.value !== last.strategy && [...sel.options].some((o) => o.value === last.strategy)) sel.value = last.strategy;

  drawChart($("chart-throughput"), [
    series(S, "completed", (s) => rate(s, s.outcomes.completed || 0), COLORS[1]),
    series(S, "failed", (s) => rate(s, sumOutcomes(s, (k) => k !== "completed" && !k.startsWith("rejected"))), COLORS[3]),
    series(S, "rejected", (s) => rate(s, sumOutcomes(s, (k) => k.startsWith("rejected"))), COLORS[2]),
  ]);
  const withLatency = S.filter((s) => s.latency_ms.count > 0);
  drawChart($("chart-latency"), [
    series(withLatency, "p50", (s) => s.latency_ms.p50),
    series(withLatency, "p90", (s) => s.latency_ms.p90),
    series(withLatency, "p99", (s) => s.latency_ms.p99),
  ]);
  drawChart($("chart-priority"), PRIORITIES.map((p) =>
    series(S.filter((s) => s.latency_by_priority_ms[p].count > 0), p, (s) => s.latency_by_priority_ms[p].p99)));
  drawChart($("chart-queue"), PRIORITIES.map((p) => series(S, p, (s) => s.queue_depth_by_priority[p])));
  const withBatches = S.filter((s) => s.batch_size.batches > 0);
  drawChart($("chart-batch"), [
    series(withBatches, "mean", (s) => s.batch_size.mean),
    series(withBatches, "p99", (s) => s.batch_size.p99),
  ]);
  drawChart($("chart-flush"), Object.keys(last.flush_reasons).map((r) =>
    series(S, r, (s) => rate(s, s.flush_reasons[r]))));
  drawChart($("chart-workers"), last.workers.map((_, i) =>
    series(S, "w" + i, (s) => (s.workers[i] || {}).utilization)), { max: 1, unit: "%" });
  drawChart($("chart-tokens"), [
    series(S, "prompt", (s) => rate(s, s.prompt_tokens)),
    series(S, "generation", (s) => rate(s, s.generation_tokens)),
  ]);
  const cont = S.filter((s) => s.continuous);
  for (const el of document.querySelectorAll(".continuous")) el.classList.toggle("hidden", !last.continuous);
  if (last.continuous) {
    drawChart($("chart-slots"), [
      series(cont, "slots in use", (s) => s.continuous.active_slots / Math.max(1, s.continuous.slots_total)),
      series(cont, "KV used", (s) => s.continuous.kv_used_tokens / Math.max(1, s.continuous.kv_capacity_tokens)),
    ], { max: 1, unit: "%" });
    const withT = cont.filter((s) => s.continuous.ttft_ms.count > 0);
    drawChart($("chart-ttft"), [
      series(withT, "TTFT p50", (s) => s.continuous.ttft_ms.p50),
      series(withT, "TTFT p99", (s) => s.continuous.ttft_ms.p99),
      series(cont.filter((s) => s.continuous.tpot_ms.count > 0), "TPOT p50", (s) => s.continuous.tpot_ms.p50),
    ]);
  }
  // Prefix caching (continuous batching, on by default): the share of looked-up prompt
  // tokens found cached, per second; a second with no admission has no rate (a gap).
  const caching = !!(last.continuous && last.continuous.prefix_cache);
  for (const el of document.querySelectorAll(".prefix")) el.classList.toggle("hidden", !caching);
  if (caching) {
    const withP = cont.filter((s) => s.continuous.prefix_cache);
    drawChart($("chart-prefix"), [
      series(withP, "hit rate", (s) => s.continuous.prefix_cache.hit_rate),
    ], { max: 1, unit: "%" });
  }
  renderAuto(S, last);
  fillTable("workers-table", last.workers.map((w, i) => [
    "worker-" + i, cls(w.status, w.status === "unhealthy" ? "bad" : "ok"),
    cls(w.circuit, w.circuit === "closed" ? "ok" : w.circuit === "open" ? "bad" : "warn"),
    String(w.pending), (w.utilization * 100).toFixed(0) + "%"]));
  fillTable("backends-table", last.backends.map((b, i) => [
    b.name || "backend-" + i, cls(b.healthy ? "yes" : "no", b.healthy ? "ok" : "bad"),
    cls(b.circuit, b.circuit === "closed" ? "ok" : b.circuit === "open" ? "bad" : "warn"),
    String(b.pending_batches), b.latency_ema_ms == null ? "–" : b.latency_ema_ms.toFixed(1) + " ms",
    rate(last, b.routed).toFixed(1)]));
}

function cls(text, c) { return { text, c }; }

function fillTable(id, rows) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren(...rows.map((r) => {
    const tr = document.createElement("tr");
    for (const cell of r) {
      const td = document.createElement("td");
      if (typeof cell === "string") td.textContent = cell; else { td.textContent = cell.text; td.className = cell.c; }
      tr.appendChild(td);
    }
    return tr;
  }));
}

function uptime(s) {
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), sec = Math.floor(s % 60);
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
}

// `#switch=<name>` in the address: once data is in, switch to <name> through the form,
// exactly as a click on "switch" does (the browser test drives the page this way).
let pendingSwitch = (location.hash.match(/switch=([a-z_]+)/) || [])[1];

async function poll() {
  try {
    const r = await fetch("/metrics/history?seconds=" + WINDOW_S, { cache: "no-store" });
    if (r.ok) {
      const h = await r.json();
      document.body.dataset.historySeconds = String(h.seconds.length);
      try {
        const j = await fetch("/metrics/json", { cache: "no-store" });
        if (j.ok) noteAuto(await j.json());
      } catch (e) { /* drawn without it */ }
      render(h);
      if (pendingSwitch && h.seconds.length >= 2 && $("strategy-select").options.length) {
        $("strategy-select").value = pendingSwitch;
        $("strategy-select").dataset.touched = "1";
        pendingSwitch = null;
        $("strategy-form").requestSubmit();
      }
    }
  } catch (e) { /* the server restarts or is gone: try again next second */ }
  setTimeout(poll, 1000);
}

function authHeaders() {
  const t = $("admin-token").value || localStorage.getItem("abe-admin-token") || "";
  return t ? { Authorization: "Bearer " + t } : {};
}

async function loadStrategies() {
  const sel = $("strategy-select");
  let names = [];
  try {
    const r = await fetch("/admin/strategy", { headers: authHeaders() });
    if (r.ok) names = (await r.json()).valid;
    else if (r.status === 401) status("admin token needed", true);
    else if (r.status === 404) status("admin endpoints disabled", true);
  } catch (e) { /* offline */ }
  if (!names.length) names = ["auto", "fixed", "queue_depth", "latency_aware", "dynamic", "multi_bin"];
  sel.replaceChildren(...names.map((n) => { const o = document.createElement("option"); o.value = o.textContent = n; return o; }));
}

function status(text, error) {
  const el = $("strategy-status");
  el.textContent = text;
  el.classList.toggle("error", !!error);
}

async function switchStrategy(ev) {
  ev.preventDefault();
  const name = $("strategy-select").value;
  const token = $("admin-token").value;
  if (token) localStorage.setItem("abe-admin-token", token);
  status("switching…");
  try {
    const r = await fetch("/admin/strategy/" + encodeURIComponent(name), { method: "POST", headers: authHeaders() });
    if (r.ok) {
      status("switched to " + name);
      $("kpi-strategy").textContent = name;
      document.body.dataset.strategySwitched = name;
    } else {
      let msg = r.status + "";
      try { msg = (await r.json()).error.message; } catch (e) { /* not JSON */ }
      if (r.status === 401) { $("admin-token").focus(); msg = "admin token needed: " + msg; }
      status(msg, true);
    }
  } catch (e) { status("server unreachable", true); }
}

function listenEvents() {
  const log = $("events-log");
  let n = 0, lost = null;
  const es = new EventSource("/events");
  const add = (kind, d) => {
    n++;
    document.body.dataset.events = String(n);
    const li = document.createElement("li");
    const t = (d.at_ms / 1000).toFixed(3) + "s ";
    if (kind === "batch") li.textContent = t + `batch  size ${d.size}  tokens ${d.tokens}  flush ${d.reason} (${d.strategy})  worker ${d.worker}`;
    else if (kind === "tick") li.textContent = t + `tick   replica ${d.replica}  entries ${d.entries}  decode ${d.decode_tokens}  prefill ${d.prefill_tokens}`;
    else if (kind === "hold") li.textContent = t + `hold   ${d.queued} queued  expects ${d.expected_joiners.toFixed(1)} of ${d.joiners_within_horizon.toFixed(1)}  for ${d.planned_wait_ms.toFixed(2)} ms  (${d.reason})`;
    else li.textContent = t + `req    ${d.priority}  ${d.outcome}  ${d.latency_ms.toFixed(1)} ms` + (d.queue_wait_ms != null ? `  queued ${d.queue_wait_ms.toFixed(1)} ms` : "") + (d.ttft_ms != null ? `  ttft ${d.ttft_ms.toFixed(1)} ms` : "") + `  ${d.completion_tokens} tok` + (d.cached_tokens != null ? `  cached ${d.cached_tokens}` : "");
    log.prepend(li);
    while (log.children.length > 60) log.lastChild.remove();
  };
  for (const kind of ["batch", "tick", "request", "hold"]) es.addEventListener(kind, (e) => add(kind, JSON.parse(e.data)));
  es.addEventListener("hello", (e) => { $("events-info").textContent = JSON.parse(e.data).sampling; });
  es.addEventListener("stats", (e) => {
    lost = JSON.parse(e.data);
    $("events-info").textContent = `sampled out ${lost.sampled_out}, dropped ${lost.engine_queue_full + lost.dropped_for_you}`;
  });
}

$("strategy-form").addEventListener("submit", switchStrategy);
$("strategy-select").addEventListener("change", (e) => { e.target.dataset.touched = "1"; });
$("admin-token").value = localStorage.getItem("abe-admin-token") || "";
loadStrategies();
listenEvents();
poll();
window.addEventListener("resize", () => { /* redrawn on the next poll */ });
