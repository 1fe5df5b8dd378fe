// The overspill console: a hash-routed page over the /v1/console/* API. No framework, no build.
// Every text goes in through textContent (h() below), so nothing from the API is ever parsed as HTML.
"use strict";

const KEY = "overspill.key";
const REFRESH_MS = 1500;
let me = null;
let timer = null;

// ------------------------------------------------------------------ helpers

function h(tag, attrs, ...children) {
  const el = document.createElementNS(
    ["svg", "rect", "text", "g", "line"].includes(tag) ? "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml", tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...options, headers });
  if (options.raw && response.ok) return response;
  const body = response.headers.get("content-type")?.includes("json") ? await response.json() : null;
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

const fmt = (n, digits = 0) =>
  n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: digits });

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${fmt(seconds, 1)} s`;
  if (seconds < 3600) return `${fmt(seconds / 60, 1)} min`;
  return `${fmt(seconds / 3600, 1)} h`;
}

const when = (epoch) => (epoch ? new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19) : "–");
const pill = (text, cls) => h("span", { class: `pill ${cls || text}` }, text);
const stat = (value, label, testid) => h("div", { class: "stat" }, h("div", { class: "value", "data-testid": testid }, value), h("div", { class: "label" }, label));
const table = (heads, rows, empty = "Nothing here.") =>
  rows.length
    ? h("table", {}, h("thead", {}, h("tr", {}, heads.map((x) => h("th", {}, x)))), h("tbody", {}, rows))
    : h("p", { class: "muted" }, empty);
const tenantQuery = (params) => (params.get("tenant") ? `tenant=${encodeURIComponent(params.get("tenant"))}` : "");

// An admin's tenant filter for a list page: one select, applied on change.
function tenantFilter(params, route) {
  if (!me.admin || me.tenants.length < 2) return [];
  const select = h("select", { name: "tenant", onchange: (e) => { location.hash = e.target.value ? `${route}?tenant=${encodeURIComponent(e.target.value)}` : route; } },
    ["", ...me.tenants].map((v) => h("option", { value: v, selected: (params.get("tenant") || "") === v }, v || "every tenant")));
  return h("form", { class: "filters" }, h("label", {}, "tenant", select));
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
}

function notFound(what) {
  show(h("section", { class: "notfound", "data-testid": "not-found" }, h("div", { class: "value" }, "404"), h("p", {}, `${what} was not found.`), h("a", { href: "#/" }, "Back to the overview")));
}

function failed(error, what) {
  if (error.status === 401) return signOut("The key was refused. Sign in again.");
  if (error.status === 404) return notFound(what);
  show(h("p", { class: "error", "data-testid": "error" }, error.message));
}

// ------------------------------------------------------------------ overview

function routeChart(series) {
  // Bars in an SVG stretched to the card's width; the labels are HTML, so they never stretch.
  const width = series.length * 10, height = 100;
  const top = Math.max(1, ...series.map((p) => p.local + p.remote + p.cache));
  const svg = h("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img", "aria-label": "jobs finished per route" });
  series.forEach((p, i) => {
    let y = height;
    for (const route of ["local", "remote", "cache"]) {
      const hgt = (p[route] / top) * height;
      if (hgt <= 0) continue;
      y -= hgt;
      svg.append(h("rect", { class: `rect-${route}`, x: i * 10 + 1, y, width: 8, height: hgt }, h("title", {}, `${route}: ${p[route]}`)));
    }
  });
  return h("div", { class: "chart-box" },
    h("div", { class: "axis" }, h("span", {}, `${fmt(top)} jobs per 10 s`), h("span", {}, "0")),
    h("div", {}, svg, h("div", { class: "axis-x" }, h("span", {}, `${Math.round((series.length * 10) / 60)} min ago`), h("span", {}, "now"))));
}

function laneCard(lane) {
  return h("div", { class: "card", "data-lane": lane.lane },
    h("h3", {}, `${lane.lane} lane`),
    h("div", { class: "stats" },
      stat(fmt(lane.depth), "packages queued", `depth-${lane.lane}`),
      stat(age(lane.oldest_age_s), "oldest waiting"),
      stat(fmt(lane.items_in_flight), "items in flight"),
      stat(fmt(lane.items_per_s, 1), "items/s (30 s)")));
}

function overviewAdmin(o) {
  const gates = o.gates.map((g) => h("tr", {}, h("td", {}, g.model), h("td", {}, pill(g.open ? "open" : "closed")), h("td", {}, g.signals.join(", ") || "–")));
  const replicas = o.replicas.map((r) => h("tr", {}, h("td", {}, r.replica), h("td", {}, pill(r.ready ? "ready" : "down", r.ready ? "ok" : "bad")),
    h("td", {}, pill(r.breaker_open ? "open" : "closed"))));
  const models = o.triton_models.map((m) => h("tr", {}, h("td", {}, m.metrics), h("td", {}, m.model), h("td", {}, fmt(m.pending)), h("td", {}, `${fmt(m.queue_ms, 1)} ms`)));
  const providers = o.providers.map((p) => h("tr", {}, h("td", {}, p.provider), h("td", {}, pill(p.breaker_open ? "open" : "closed")),
    h("td", {}, p.rate_factor === undefined ? "–" : `${fmt(100 * p.rate_factor)} % of its limit`)));
  const budgets = o.budgets.map((b) => h("tr", {}, h("td", {}, b.tenant), h("td", {}, `$${fmt(b.budget, 2)}`), h("td", {}, `$${fmt(b.spent, 4)}`), h("td", {}, `$${fmt(b.left, 2)}`)));
  const workers = o.workers.map((w) => h("tr", {}, h("td", {}, w.worker), h("td", {}, pill(w.alive ? (w.draining ? "draining" : "alive") : "gone", w.alive ? "ok" : "bad")),
    h("td", {}, Object.entries(w.packages).map(([k, v]) => `${k} ${v}`).join(", ")), h("td", {}, age(w.last_claim_s_ago)), h("td", {}, age(w.up_s))));
  return [
    h("h2", {}, "Overflow gates"), table(["model", "gate", "held open by"], gates, "No local model."),
    h("h2", {}, "Triton replicas"), table(["replica (gRPC)", "ready", "breaker"], replicas, "No replica reported."),
    h("h2", {}, "Triton models"), table(["Triton (metrics)", "model", "pending requests", "queue time per execution"], models, "No Triton metrics read."),
    h("h2", {}, "Remote providers"), table(["provider", "breaker", "rate limit in use"], providers, "No remote provider."),
    h("h2", {}, "Remote budgets this month"), table(["tenant", "budget", "spent", "left"], budgets, "No tenant has a budget."),
    h("h2", {}, "Workers"), table(["worker", "state", "packages running", "last claim", "up"], workers, "No worker has reported."),
  ];
}

async function overview() {
  const o = await api("/v1/console/overview");
  const total = o.activity.series.reduce((a, p) => ({ local: a.local + p.local, remote: a.remote + p.remote, cache: a.cache + p.cache }), { local: 0, remote: 0, cache: 0 });
  show(
    h("h1", {}, "Overview"),
    o.admin && !o.workers.some((w) => w.alive)
      ? h("p", { class: "banner", "data-testid": "no-worker" }, "No live worker: queued jobs wait until one starts.") : null,
    h("div", { class: "grid" }, o.lanes.map(laneCard)),
    h("h2", {}, "Tenants in the lanes (fair share)"),
    table(["tenant", "lane", "items queued", "items in flight", "items/s (30 s)", "oldest waiting"],
      o.tenants.map((t) => h("tr", { "data-tenant": t.tenant }, h("td", {}, t.tenant), h("td", {}, t.lane), h("td", {}, fmt(t.queued_items)),
        h("td", {}, fmt(t.items_in_flight)), h("td", {}, fmt(t.items_per_s, 1)), h("td", {}, age(t.oldest_wait_s)))),
      "No tenant has work queued or running."),
    h("h2", {}, "Jobs finished per route, last 5 minutes (10 s bars)"),
    h("div", { class: "card" }, routeChart(o.activity.series),
      h("div", { class: "legend" }, ["local", "remote", "cache"].map((r) => h("span", { class: r, "data-testid": `route-${r}` }, `${r} ${fmt(total[r])}`)))),
    o.admin ? overviewAdmin(o) : [],
    h("p", { class: "muted" }, `Updated ${when(o.at)} UTC`),
  );
  return true;
}

// ------------------------------------------------------------------ jobs

async function jobs(params) {
  const query = new URLSearchParams([...params].filter(([, v]) => v));
  const data = await api(`/v1/console/jobs?${query}`);
  const rows = data.data.map((j) => h("tr", {}, h("td", {}, h("a", { href: `#/jobs/${j.id}` }, j.id)), h("td", {}, j.tenant), h("td", {}, j.kind), h("td", {}, j.lane || "–"), h("td", {}, pill(j.status)), h("td", {}, when(Number(j.created_at))), h("td", {}, j.attempts || "0")));
  const select = (name, values) => h("label", {}, name, h("select", { name }, ["", ...values].map((v) => h("option", { value: v, selected: params.get(name) === v }, v || "any"))));
  const filters = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); location.hash = `#/jobs?${new URLSearchParams([...new FormData(e.target)].filter(([, v]) => v))}`; } },
    me.admin ? select("tenant", me.tenants) : [],
    select("status", ["queued", "running", "succeeded", "failed", "cancelled", "expired"]),
    select("lane", ["interactive", "bulk"]),
    h("button", { type: "submit" }, "Filter"));
  const lookup = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); location.hash = `#/jobs/${new FormData(e.target).get("id").trim()}`; } },
    h("label", {}, "job id", h("input", { name: "id", required: true, size: 32, placeholder: "job_…" })), h("button", { type: "submit" }, "Open"));
  show(h("h1", {}, "Jobs"), lookup, filters, table(["id", "tenant", "kind", "lane", "status", "created (UTC)", "attempts"], rows, "No job submitted over the API matches."),
    h("p", { class: "muted" }, "Lists the newest jobs submitted over the HTTP API; any job is found by its id."));
}

async function job(id) {
  const d = await api(`/v1/console/jobs/${encodeURIComponent(id)}`);
  const e = d.envelope, t = e.timings || {};
  const cancel = h("button", { class: "danger", "data-testid": "cancel-job", disabled: e.status !== "queued" && e.status !== "running",
    onclick: async (ev) => { ev.target.disabled = true; try { await api(`/v1/console/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" }); render(); } catch (err) { msg.textContent = err.message; } } }, "Cancel job");
  const msg = h("p", { class: "error" });
  const kv = (pairs) => h("dl", { class: "kv" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  show(
    h("h1", {}, `Job ${e.id}`),
    h("div", { class: "grid" },
      h("div", { class: "card" }, h("div", { class: "stats" }, stat(pill(e.status, `${e.status} big`), "status", "job-status"), stat(e.route || "–", "route"), stat(fmt(e.attempts), "attempts"), stat(`${fmt(t.total_ms, 1)} ms`, "total"))),
      h("div", { class: "card" }, kv([["tenant", e.tenant], ["kind", e.kind], ["model", e.model || "–"], ["lane", d.lane || "–"], ["route reason", e.route_reason || "–"], ["created", when(e.created_at)], ["finished", when(e.finished_at)]]))),
    h("h2", {}, "Timings"),
    h("div", { class: "card" }, kv([["queued", `${fmt(t.queued_ms, 1)} ms`], ["batching", `${fmt(t.batch_ms, 1)} ms`], ["inference", `${fmt(t.infer_ms, 1)} ms`], ["batch size", fmt(t.batch_size)]])),
    e.error ? [h("h2", {}, "Error"), h("p", { class: "error" }, `${e.error.type}: ${e.error.message}`)] : [],
    h("h2", {}, "Webhook delivery"),
    d.webhook ? h("div", { class: "card" }, kv([["state", pill(d.webhook.state, d.webhook.state === "delivered" ? "ok" : d.webhook.state === "dead" ? "bad" : "queued")],
      ["attempts", d.webhook.attempts], ["url", d.webhook.url], ["webhook id", d.webhook.webhook_id], ["last status", d.webhook.last_status || "–"],
      ["error", d.webhook.error_type ? `${d.webhook.error_type}: ${d.webhook.error}` : "–"], ["updated", when(Number(d.webhook.updated_at))]])) : h("p", { class: "muted" }, "No webhook."),
    h("div", { class: "actions" }, cancel), msg,
    h("h2", {}, "Envelope"), h("pre", {}, JSON.stringify(e, null, 2)),
  );
}

// ------------------------------------------------------------------ batches

function eta(b) {
  const c = b.request_counts, done = c.completed + c.failed;
  if (b.status !== "in_progress" || !b.in_progress_at || !done) return "–";
  const rate = done / Math.max(Date.now() / 1000 - b.in_progress_at, 1);
  return age((c.total - done) / rate);
}

const progress = (b) => h("progress", { max: Math.max(b.request_counts.total, 1), value: b.request_counts.completed + b.request_counts.failed });

async function batches(params) {
  const data = await api(`/v1/console/batches?${tenantQuery(params)}`);
  const rows = data.data.map((b) => h("tr", {}, h("td", {}, h("a", { href: `#/batches/${b.id}` }, b.id)), h("td", {}, b.tenant), h("td", {}, b.endpoint), h("td", {}, pill(b.status)),
    h("td", {}, progress(b), ` ${fmt(b.request_counts.completed)} ✓ ${fmt(b.request_counts.failed)} ✗ / ${fmt(b.request_counts.total)}`),
    h("td", {}, Object.entries((b.overspill && b.overspill.routes) || {}).map(([r, n]) => `${r} ${fmt(n)}`).join(", ") || "–"), h("td", {}, eta(b)), h("td", {}, when(b.created_at))));
  show(h("h1", {}, "Batches"), tenantFilter(params, "#/batches"), table(["id", "tenant", "endpoint", "status", "progress", "routes", "ETA", "created (UTC)"], rows, "No batch yet."));
}

async function download(fileId, name) {
  const response = await api(`/v1/files/${encodeURIComponent(fileId)}/content`, { raw: true });
  const url = URL.createObjectURL(await response.blob());
  h("a", { href: url, download: name }).click();
  URL.revokeObjectURL(url);
}

async function batch(id) {
  const b = await api(`/v1/console/batches/${encodeURIComponent(id)}`);
  const c = b.request_counts, routes = (b.overspill && b.overspill.routes) || {};
  const msg = h("p", { class: "error" });
  const cancel = h("button", { class: "danger", "data-testid": "cancel-batch", disabled: !["validating", "in_progress"].includes(b.status),
    onclick: async (ev) => { ev.target.disabled = true; try { await api(`/v1/console/batches/${encodeURIComponent(id)}/cancel`, { method: "POST" }); render(); } catch (err) { msg.textContent = err.message; } } }, "Cancel batch");
  const files = [["output", b.output_file_id], ["errors", b.error_file_id]].filter(([, f]) => f).map(([label, f]) =>
    h("button", { onclick: () => download(f, `${b.id}-${label}.jsonl`).catch((err) => { msg.textContent = err.message; }) }, `Download ${label}`));
  show(
    h("h1", {}, `Batch ${b.id}`),
    h("div", { class: "card" }, h("div", { class: "stats" }, stat(pill(b.status, `${b.status} big`), "status", "batch-status"), stat(fmt(c.completed), "completed"), stat(fmt(c.failed), "failed"), stat(eta(b), "ETA")),
      h("div", { class: "big-progress" }, progress(b)), h("p", { class: "muted" }, `${fmt(c.total)} requests · ${b.endpoint} · tenant ${b.tenant} · created ${when(b.created_at)} UTC`)),
    h("h2", {}, "Route split"),
    table(["route", "jobs"], Object.entries(routes).map(([r, n]) => h("tr", {}, h("td", {}, r), h("td", {}, fmt(n)))), "No job has finished yet."),
    h("div", { class: "actions" }, cancel, files), msg,
  );
}

// ------------------------------------------------------------------ webhooks, usage, policy

async function webhooks(params) {
  const data = await api(`/v1/console/dead-letters?${tenantQuery(params)}`);
  const msg = h("p", { class: "notice", "data-testid": "replay-result" });
  const replay = async (letter) => {
    await api(`/v1/console/dead-letters/${encodeURIComponent(letter.delivery.webhook_id)}/replay?tenant=${encodeURIComponent(letter.tenant)}`, { method: "POST" });
  };
  const rows = data.data.map((d) => h("tr", {}, h("td", {}, d.delivery.webhook_id), h("td", {}, d.tenant), h("td", {}, h("a", { href: `#/jobs/${d.delivery.job_id}` }, d.delivery.job_id)),
    h("td", {}, d.delivery.url), h("td", {}, `${d.error.type}${d.status_code ? ` (${d.status_code})` : ""}`), h("td", {}, fmt(d.attempts)), h("td", {}, when(d.failed_at)),
    h("td", {}, h("button", { "data-testid": "replay", onclick: async (ev) => { ev.target.disabled = true; try { await replay(d); msg.textContent = `Replayed ${d.delivery.webhook_id}`; } catch (err) { msg.textContent = err.message; } } }, "Replay"))));
  const all = h("button", { class: "primary", disabled: !data.data.length, onclick: async (ev) => { ev.target.disabled = true; let n = 0; for (const d of data.data) { try { await replay(d); n += 1; } catch (err) { /* shown below */ } } msg.textContent = `Replayed ${n} of ${data.data.length}`; } }, "Replay all");
  show(h("h1", {}, "Webhook dead letters"), tenantFilter(params, "#/webhooks"), h("div", { class: "actions" }, all), msg,
    table(["webhook id", "tenant", "job", "url", "why", "attempts", "failed (UTC)", ""], rows, "No dead letter: every webhook was delivered."));
}

async function usage(params) {
  const query = new URLSearchParams({ what_if: "true" });
  if (params.get("tenant")) query.set("tenant", params.get("tenant"));
  const u = await api(`/v1/usage?${query}`);
  const rows = u.data.map((r) => h("tr", {}, h("td", {}, r.day), h("td", {}, r.tenant), h("td", {}, r.model), h("td", {}, r.route), h("td", {}, fmt(r.requests)), h("td", {}, fmt(r.items)),
    h("td", {}, fmt(r.prompt_tokens + r.completion_tokens)), h("td", {}, fmt(r.gpu_s, 2)), h("td", {}, `$${fmt(r.cost, 4)}`)));
  const w = u.what_if || {};
  show(h("h1", {}, "Usage and cost"), tenantFilter(params, "#/usage"),
    h("div", { class: "card" }, h("div", { class: "stats" }, stat(`$${fmt(w.cost, 4)}`, "cost this period"), stat(`$${fmt(w.remote_cost, 4)}`, "of it on remotes"),
      stat(`$${fmt(w.all_remote_cost, 4)}`, "all on remotes would be"), stat(`$${fmt(w.saved, 4)}`, "saved by cost routing"))),
    h("p", { class: "muted" }, `${u.start} to ${u.end}${u.tenant ? `, tenant ${u.tenant}` : ", every tenant"}`),
    table(["day", "tenant", "model", "route", "requests", "items", "tokens", "GPU s", "cost"], rows, "No usage booked in this period."),
    h("h2", {}, "What-if report"), h("pre", {}, JSON.stringify(w, null, 2)));
}

async function policy() {
  const p = await api("/v1/admin/policy");
  const area = h("textarea", { name: "policy", spellcheck: "false" }, JSON.stringify(p.stored || {}, null, 2));
  const msg = h("p", { "data-testid": "policy-result" });
  const save = h("button", { class: "primary", onclick: async () => {
    try { await api("/v1/admin/policy", { method: "PUT", body: area.value, headers: { "Content-Type": "application/json" } }); msg.className = "notice"; msg.textContent = "Stored; workers apply it within their refresh interval."; }
    catch (err) { msg.className = "error"; msg.textContent = err.message; } } }, "Store policy");
  const workers = Object.entries(p.workers).map(([w, d]) => h("tr", {}, h("td", {}, w), h("td", {}, d.source), h("td", {}, h("pre", {}, JSON.stringify(d.policy)))));
  show(h("h1", {}, "Routing policy"), h("h2", {}, "Stored in Redis (wins over the workers' file)"), area, h("div", { class: "actions" }, save), msg,
    h("h2", {}, "In force on each worker"), table(["worker", "source", "policy"], workers, "No worker has reported a policy."));
}

// ------------------------------------------------------------------ shell

const ROUTES = [
  [/^\/?$/, () => overview(), "overview", true],
  [/^\/jobs$/, (m, q) => jobs(q), "jobs"],
  [/^\/jobs\/([^/]+)$/, (m) => job(decodeURIComponent(m[1])), "jobs", false, "This job"],
  [/^\/batches$/, (m, q) => batches(q), "batches"],
  [/^\/batches\/([^/]+)$/, (m) => batch(decodeURIComponent(m[1])), "batches", false, "This batch"],
  [/^\/webhooks$/, (m, q) => webhooks(q), "webhooks"],
  [/^\/usage$/, (m, q) => usage(q), "usage"],
  [/^\/policy$/, () => policy(), "policy"],
];

async function render() {
  clearTimeout(timer);
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  for (const [re, view, nav, live, what] of ROUTES) {
    const m = path.match(re);
    if (!m) continue;
    document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === nav));
    try {
      await view(m, params);
      if (live) timer = setTimeout(render, REFRESH_MS);
    } catch (error) {
      failed(error, what || "This page");
      if (live && error.status !== 401) timer = setTimeout(render, REFRESH_MS);
    }
    return;
  }
  notFound("This page");
}

function signOut(message) {
  clearTimeout(timer);
  sessionStorage.removeItem(KEY);
  me = null;
  document.getElementById("top").hidden = true;
  const form = document.getElementById("login").content.cloneNode(true);
  show(form);
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, new FormData(e.target).get("key").trim());
    await start();
  });
}

async function start() {
  try {
    me = await api("/v1/console/me");
  } catch (error) {
    return signOut(sessionStorage.getItem(KEY) ? "The key was refused." : "");
  }
  document.getElementById("top").hidden = false;
  document.getElementById("who").textContent = `${me.tenant}${me.admin ? " (admin)" : ""}`;
  document.querySelectorAll("[data-admin]").forEach((a) => { a.hidden = !me.admin; });
  document.getElementById("signout").hidden = !me.auth;
  await render();
}

window.addEventListener("hashchange", () => me && render());
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("signout").addEventListener("click", () => signOut());
  start();
});
