// jetflow inspector: a single page over the JSON API under /v1/.
//
// Everything the server sends goes into the page as text (textContent,
// through el() below); no server data is ever parsed as HTML.
"use strict";

const REFRESH_MS = 3000;
const STATUSES = ["running", "blocked", "completed", "failed", "cancelled"];
const UI_HEADERS = { "X-Jetflow-UI": "1", Accept: "application/json" };

// ---- DOM helpers -------------------------------------------------------

// el builds an element: attrs are set as properties or attributes
// (dataset via "data-*"), children are nodes or strings (as text).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "for") node.setAttribute(k, v);
    else node[k] = v;
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    node.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
}

const $ = (sel) => document.querySelector(sel);

// active reports whether a run of status has not ended: it runs, or it is
// blocked (its code diverges from its history) and waits for code that
// replays it, or for an operator.
function active(status) {
  return status === "running" || status === "blocked";
}

function statusLabel(status) {
  return el("span", { class: "status status-" + status, "data-status": status, text: status || "unknown" });
}

// ---- formatting --------------------------------------------------------

function parseTime(s) {
  if (!s || s.startsWith("0001-")) return null;
  const t = Date.parse(s);
  return Number.isNaN(t) ? null : t;
}

const pad = (n, w = 2) => String(n).padStart(w, "0");

// fmtTime is the one format of every time the page shows: UTC, to the
// second ("2026-11-27 09:13:55 UTC"). Its element (timeEl) says how long
// ago (or how soon) it is, and the time to the millisecond, in its tooltip.
function fmtTime(s) {
  const t = parseTime(s);
  if (t === null) return "—";
  const d = new Date(t);
  return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())} UTC`;
}

// relTime says how far t is from now: "5m 02s ago", "in 59m 58s".
function relTime(t) {
  const d = t - Date.now();
  if (Math.abs(d) < 1000) return "now";
  return d > 0 ? "in " + fmtDur(d) : fmtDur(-d) + " ago";
}

function timeTitle(s) {
  const t = parseTime(s);
  return t === null ? "" : relTime(t) + " · " + new Date(t).toISOString().replace("T", " ").replace("Z", " UTC");
}

// timeEl shows the time s (RFC 3339) as fmtTime does; its tooltip is drawn
// again when the pointer enters it, so its "ago" is never stale.
function timeEl(s, id) {
  const node = el("time", { id, dateTime: s || "", title: timeTitle(s), text: fmtTime(s) });
  node.addEventListener("mouseenter", () => { node.title = timeTitle(s); });
  return node;
}

function fmtDur(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

// pretty shows a JSON value of the API (already decoded) indented.
function pretty(v) {
  return v === undefined || v === null ? "—" : JSON.stringify(v, null, 2);
}

// ---- API -----------------------------------------------------------------

// api calls the JSON API with the inspector's header (with which the API
// takes the login cookie) and returns {ok, status, data}; it never throws:
// a request that fails on the way (the network, a cut connection, a body
// cut short) is {ok: false, status: 0} with the reason. A 401 shows the
// log-in banner.
async function api(method, path, body) {
  const opts = { method, headers: { ...UI_HEADERS }, credentials: "same-origin" };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  let res, text;
  try {
    res = await fetch(path, opts);
    text = await res.text();
  } catch (e) {
    return { ok: false, status: 0, data: { title: "Network error", detail: String(e) } };
  }
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { detail: text }; }
  if (res.status === 401) showBanner("Not authorized (401): the token is missing or not valid. ", true);
  return { ok: res.ok, status: res.status, data };
}

function problemText(r) {
  const d = r.data || {};
  const head = r.status ? `${r.status} ${d.title || ""}`.trim() : (d.title || "Error");
  return d.detail ? `${head}: ${d.detail}` : head;
}

function showBanner(text, login) {
  const b = $("#banner");
  b.replaceChildren(text, login ? el("a", { href: "/ui/", text: "Log in again" }) : null);
  b.hidden = false;
}

function clearBanner() { $("#banner").hidden = true; }

// ---- confirmation dialog -------------------------------------------------

// One dialog serves every confirmation, one at a time. Its "close" event is
// dispatched after the dialog closed (Chromium: at the next animation
// frame), so it can arrive after the dialog was opened again for the next
// confirmation: an opening is therefore answered by the dialog's state
// (closed, and its returnValue), never by whichever close event comes
// next. confirming is the opening not answered yet.
let confirming = null;

// settleConfirm answers the opening not answered yet, if the dialog is
// closed: with the extra input's value (or true) when it was closed by the
// confirm button, null otherwise. A repeat call does nothing.
function settleConfirm() {
  const dlg = $("#confirm");
  if (!confirming || dlg.open) return;
  const { resolve, field } = confirming;
  confirming = null;
  resolve(dlg.returnValue === "ok" ? (field ? field.value : true) : null);
}

$("#confirm").addEventListener("close", settleConfirm);
$("#confirm-cancel").addEventListener("click", () => $("#confirm").close("cancel"));

// confirmAction shows the dialog and resolves to the extra input's value
// (or true) on confirm, null on cancel or Esc. body (nodes) is shown
// under the text, and wide widens the dialog for it. While the dialog is
// open another confirmation resolves to null at once.
function confirmAction({ title, text, ok, input, body, wide }) {
  const dlg = $("#confirm");
  if (dlg.open) return Promise.resolve(null);
  settleConfirm(); // the previous opening, whose close event may still be on its way
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = ok;
  dlg.classList.toggle("wide", !!wide);
  const extra = $("#confirm-extra");
  extra.replaceChildren();
  if (body) append(extra, [body]);
  let field = null;
  if (input) {
    field = el("input", { id: "confirm-input", type: "text", required: true, autocomplete: "off", placeholder: input.placeholder || "" });
    extra.append(el("label", { for: "confirm-input", text: input.label }), field);
  }
  return new Promise((resolve) => {
    confirming = { resolve, field };
    dlg.returnValue = "";
    dlg.showModal();
    (field || $("#confirm-cancel")).focus();
  });
}

// ---- routing ---------------------------------------------------------------

let view = null; // the current view: {refresh(), stop()}

function route() {
  if (view) view.stop();
  clearBanner();
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const m = path.match(/^\/runs\/(.+)$/);
  const workers = path === "/workers";
  const params = new URLSearchParams(query || "");
  view = m ? runView(decodeURIComponent(m[1]), params.get("step") || "") : workers ? workersView() : listView(params);
  $("#nav-runs").setAttribute("aria-current", m || workers ? "false" : "page");
  $("#nav-workers").setAttribute("aria-current", workers ? "page" : "false");
  view.refresh();
  schedule();
}

// One timer refreshes the current view every REFRESH_MS while the tab is
// visible; a refresh never overlaps the previous one.
let timer = null;
let busy = false;
function schedule() {
  clearTimeout(timer);
  if (document.hidden) {
    $("#live").textContent = "paused (tab hidden)";
    return;
  }
  timer = setTimeout(async () => {
    if (!busy && view && view.live()) {
      busy = true;
      try { await view.refresh(); } finally { busy = false; }
    }
    schedule();
  }, REFRESH_MS);
}

function stamp() {
  $("#live").textContent = "updated " + fmtTime(new Date().toISOString());
}

// ---- counts bar ------------------------------------------------------------

async function refreshCounts(workflow, current) {
  const q = workflow ? "?workflow=" + encodeURIComponent(workflow) : "";
  const r = await api("GET", "/v1/runs/counts" + q);
  const bar = $("#counts");
  if (!r.ok || !r.data || typeof r.data.running !== "number") {
    bar.replaceChildren();
    return;
  }
  if (bar.children.length !== STATUSES.length) {
    bar.replaceChildren(...STATUSES.map((s) => el("a", { class: "count s-" + s, "data-count": s },
      el("span", { class: "status", text: s }), el("span", { class: "n" }))));
  }
  for (const a of bar.children) {
    const s = a.dataset.count;
    a.querySelector(".n").textContent = String(r.data[s]);
    a.href = "#/?" + listQuery({ workflow, status: s === current ? "" : s });
    a.setAttribute("aria-current", s === current ? "true" : "false");
    a.title = s === current ? "show every status" : "show " + s + " runs only";
  }
}

function listQuery(f) {
  const q = new URLSearchParams();
  for (const k of ["workflow", "status", "prefix", "since", "until"]) if (f[k]) q.set(k, f[k]);
  for (const [name, value] of Object.entries(f.attrs || {})) q.set("attr." + name, value);
  return q.toString();
}

// The search box holds a run ID (or its beginning), or attribute terms
// name=value separated by spaces (order_id=42 customer=7): the runs
// started with those attributes (GET /v1/runs?attr.<name>=<value>).
const ATTR_TERM = /^([a-z][a-z0-9_]{0,31})=(.+)$/;

function parseSearch(text) {
  const terms = text.split(/\s+/).filter(Boolean);
  if (!terms.length || !terms.every((t) => ATTR_TERM.test(t))) return { prefix: text, attrs: {} };
  const attrs = {};
  for (const t of terms) {
    const [, name, value] = t.match(ATTR_TERM);
    attrs[name] = value;
  }
  return { prefix: "", attrs };
}

function searchText(f) {
  const terms = Object.entries(f.attrs || {}).map(([name, value]) => name + "=" + value);
  return terms.length ? terms.join(" ") : f.prefix;
}

// ---- runs list -------------------------------------------------------------

// The time range's inputs hold UTC, as every time the page shows.
function utcInput(iso) {
  const t = parseTime(iso);
  return t === null ? "" : new Date(t).toISOString().slice(0, 19);
}

function fromUTCInput(v) {
  const t = v ? Date.parse(v + "Z") : NaN;
  return Number.isNaN(t) ? "" : new Date(t).toISOString();
}

function listView(params) {
  const f = {};
  for (const k of ["workflow", "status", "prefix", "since", "until"]) f[k] = params.get(k) || "";
  f.attrs = {};
  for (const [k, v] of params) if (k.startsWith("attr.")) f.attrs[k.slice(5)] = v;
  const cursors = [""]; // cursors[i] reads page i
  let page = 0;
  let next = "";
  let stopped = false;

  const search = el("input", { id: "search", type: "search", value: searchText(f), placeholder: "run ID, its beginning, or order_id=42", spellcheck: false, autocomplete: "off" });
  const workflow = el("input", { id: "f-workflow", type: "text", value: f.workflow, placeholder: "all", size: 14, autocomplete: "off" });
  const status = el("select", { id: "f-status" },
    el("option", { value: "", text: "all" }), STATUSES.map((s) => el("option", { value: s, text: s, selected: s === f.status })));
  const since = el("input", { id: "f-since", type: "datetime-local", step: 1, value: utcInput(f.since) });
  const until = el("input", { id: "f-until", type: "datetime-local", step: 1, value: utcInput(f.until) });
  const apply = () => {
    const q = {
      workflow: workflow.value.trim(), status: status.value, ...parseSearch(search.value.trim()),
      since: fromUTCInput(since.value),
      until: fromUTCInput(until.value),
    };
    location.hash = "#/?" + listQuery(q);
  };
  const form = el("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); apply(); } },
    el("div", { class: "field grow" }, el("label", { for: "search" }, "Run ID (exact or prefix) or attribute name=value ", el("span", { class: "kbd", text: "/" })), search),
    el("div", { class: "field" }, el("label", { for: "f-workflow", text: "Workflow" }), workflow),
    el("div", { class: "field" }, el("label", { for: "f-status", text: "Status" }), status),
    el("div", { class: "field" }, el("label", { for: "f-since", text: "Changed from (UTC)" }), since),
    el("div", { class: "field" }, el("label", { for: "f-until", text: "until" }), until),
    el("button", { type: "submit", class: "primary", text: "Apply" }),
    el("button", { type: "button", text: "Clear", onclick: () => { location.hash = "#/"; } }));
  status.addEventListener("change", apply);

  const exact = el("div", { id: "exact", class: "panel exact", hidden: true });
  const tbody = el("tbody", { id: "runs-body" });
  const table = el("table", { class: "runs", id: "runs" },
    el("thead", {}, el("tr", {},
      el("th", { class: "c-status", scope: "col", text: "Status" }),
      el("th", { class: "c-id", scope: "col", text: "Run ID" }),
      el("th", { class: "c-wf", scope: "col", text: "Workflow" }),
      el("th", { class: "c-attrs", scope: "col", text: "Attributes" }),
      el("th", { class: "c-started", scope: "col", text: "Started" }),
      el("th", { class: "c-dur", scope: "col", text: "Duration" }),
      el("th", { class: "c-err", scope: "col", text: "Error" }),
      el("th", { class: "c-gen", scope: "col", text: "Gen." }),
      el("th", { class: "c-dup", scope: "col", text: "Dupl." }))),
    tbody);
  const empty = el("div", { class: "empty", id: "runs-empty", text: "No runs match.", hidden: true });
  const info = el("span", { class: "tnum", id: "page-info" });
  const prev = el("button", { type: "button", id: "prev", text: "← Newer", onclick: () => { page--; load(); } });
  const more = el("button", { type: "button", id: "next", text: "Older →", onclick: () => { cursors[page + 1] = next; page++; load(); } });
  const error = el("div", { class: "result err", id: "list-error", role: "alert", hidden: true });

  $("#view").replaceChildren(form, exact, error, el("div", { class: "panel" }, table, empty), el("div", { class: "pager" }, info, prev, more));

  // A row per index, reused on every refresh: only texts change.
  function setRow(tr, run) {
    if (!tr.cells.length) {
      const id = el("td", { class: "c-id" }, el("a", {}));
      append(tr, [el("td", { class: "c-status" }), id, el("td", { class: "c-wf" }), el("td", { class: "c-attrs" }),
        el("td", { class: "c-started" }), el("td", { class: "c-dur num" }), el("td", { class: "c-err" }),
        el("td", { class: "c-gen num" }), el("td", { class: "c-dup num" })]);
      tr.addEventListener("click", (e) => { if (e.target.tagName !== "A") location.hash = tr.querySelector("a").getAttribute("href"); });
    }
    tr.dataset.runId = run.run_id;
    tr.dataset.status = run.status;
    const c = tr.cells;
    if (c[0].firstChild?.dataset?.status !== run.status) c[0].replaceChildren(statusLabel(run.status));
    const a = c[1].firstChild;
    a.textContent = run.run_id;
    a.title = run.run_id;
    a.href = "#/runs/" + encodeURIComponent(run.run_id);
    c[2].textContent = run.workflow;
    c[3].replaceChildren();
    append(c[3], [attrLinks(run.attributes)]);
    c[3].title = attrText(run.attributes);
    c[4].replaceChildren(timeEl(run.created_at));
    c[5].textContent = runDuration(run);
    c[5].title = active(run.status) ? run.status + " for " + runDuration(run) : "ended " + fmtTime(run.updated_at);
    c[6].textContent = run.error ? run.error.message || run.error.kind : "";
    c[6].title = run.error ? `${run.error.kind}: ${run.error.message}` : "";
    c[7].textContent = String(run.generation || 0);
    c[8].textContent = String(run.duplicates || 0);
  }

  // A run whose ID is the box's text, whatever the list shows: a run ID
  // may hold "=" too.
  async function showExact() {
    const id = searchText(f);
    if (!id || /\s/.test(id)) { exact.hidden = true; return; }
    const r = await api("GET", "/v1/runs/" + encodeURIComponent(id));
    if (stopped) return;
    if (r.ok && r.data) {
      exact.replaceChildren("Exact match: ", statusLabel(r.data.status), " ",
        el("a", { href: "#/runs/" + encodeURIComponent(r.data.run_id), id: "exact-link", class: "mono", text: r.data.run_id }),
        el("span", { class: "muted", text: " · " + r.data.workflow }));
      exact.hidden = false;
    } else {
      exact.hidden = true;
    }
  }

  async function load() {
    const q = new URLSearchParams(listQuery(f));
    if (cursors[page]) q.set("cursor", cursors[page]);
    q.set("limit", "50");
    const [r] = await Promise.all([api("GET", "/v1/runs?" + q), refreshCounts(f.workflow, f.status), showExact()]);
    if (stopped) return;
    if (!r.ok) {
      error.textContent = problemText(r);
      error.hidden = false;
      return;
    }
    error.hidden = true;
    const runs = r.data.runs || [];
    next = r.data.next_cursor || "";
    while (tbody.rows.length > runs.length) tbody.deleteRow(-1);
    runs.forEach((run, i) => setRow(tbody.rows[i] || tbody.insertRow(), run));
    empty.hidden = runs.length > 0;
    table.hidden = runs.length === 0;
    info.textContent = runs.length ? `page ${page + 1} · ${runs.length} runs` : "";
    prev.disabled = page === 0;
    more.disabled = !next;
    stamp();
  }

  return {
    refresh: load,
    live: () => true,
    stop: () => { stopped = true; },
  };
}

// ---- run page ----------------------------------------------------------------

// runView shows the run id; target is a step ID of it (#/runs/<id>?step=
// <step-id>, as the link to a rerun's from step), marked in the timeline
// and scrolled to once it is drawn.
function runView(id, target) {
  let stopped = false;
  let scrolled = !target;
  let last = "";
  let run = null;
  let asked = 0; // reads of the run asked for
  let shown = 0; // the latest of them shown: an older answer arriving later is dropped
  const result = el("div", { class: "result", id: "action-result", role: "status", "aria-live": "polite", hidden: true });
  const body = el("div", { id: "run" });
  $("#view").replaceChildren(el("a", { class: "crumb", href: "#/", text: "← All runs" }), body, result);

  // say shows an action's state in the result line: "pending" while its
  // request is on its way, then its answer (ok) or its error. text is a
  // string, or strings and nodes (a link to a run).
  function say(ok, text) {
    result.className = "result " + (ok === "pending" ? "pending" : ok ? "ok" : "err");
    result.replaceChildren();
    append(result, [text]);
    result.hidden = false;
  }

  // act asks for confirmation, then says that the action is on its way,
  // calls it, reads the run again and says the action's answer or its
  // error (api never throws): a confirmed action always ends in a shown
  // answer, shown once the page shows the run as it is after the action.
  async function act(opts, pending, call, describe) {
    const v = await confirmAction(opts);
    if (v === null) return;
    say("pending", pending);
    const r = await call(v);
    await load(true);
    say(r.ok, r.ok ? describe(r.data) : problemText(r));
  }

  // button returns the view's button for key, made by attrs the first
  // time: a drawing moves the same element into place, so a click whose
  // press and release straddle a drawing still lands on its button.
  const buttons = new Map();
  function button(key, attrs) {
    if (!buttons.has(key)) buttons.set(key, el("button", { type: "button", ...attrs }));
    return buttons.get(key);
  }

  const cancel = () => act(
    { title: "Cancel this run?", text: `Run ${id} and its attached child runs will be cancelled. Steps already done stay done.`, ok: "Cancel run" },
    `Cancelling run ${id}…`,
    () => api("POST", `/v1/runs/${encodeURIComponent(id)}/cancel`),
    (d) => d.already_cancelled ? `Run ${d.run_id} was already cancelled.` :
      `Run ${d.run_id} cancelled` + (d.children && d.children.length ? ` with ${d.children.length} child run(s): ${d.children.join(", ")}` : "") + ".");

  // unblock and accept both go through POST /v1/runs/{id}/unblock: a
  // replay with the workers' code, or past the step the block names, whose
  // dialog says which step runs again.
  const unblockCall = (accept) => () => api("POST", `/v1/runs/${encodeURIComponent(id)}/unblock`, { accept_divergence: accept });
  const unblocked = (d) => `Run ${d.run_id} unblocked: ${d.status}` + (d.waived ? `, without step ${d.waived} of its history (waived).` : ", replayed with the workers' code.");
  const unblock = () => act(
    { title: "Unblock this run?", text: unblockText(id, run.block), ok: "Unblock" },
    `Unblocking run ${id}…`, unblockCall(false), unblocked);
  const accept = () => act(
    { title: "Accept the divergence?", text: acceptText(run.block), ok: "Accept and run again" },
    `Unblocking run ${id} past its history's step…`, unblockCall(true), unblocked);

  const startAgain = () => act(
    { title: "Start this run again?", text: `A new run of ${run.workflow} starts under run ID ${id} (generation ${(run.generation || 0) + 1}) with the same input. Every step runs again under new step IDs: charges, emails and other side effects repeat. To keep what succeeded, use Rerun.`, ok: "Start again" },
    `Starting run ${id} again…`,
    () => api("POST", `/ui/api/runs/${encodeURIComponent(id)}/start-again`),
    (d) => `Run ${d.run_id} started again (${d.outcome}); status ${d.status}.`);

  const resetKey = (tk) => {
    const [scope, scopeId] = keyScope(tk.key);
    const q = new URLSearchParams({ scope });
    if (scope === "run") q.set("run_id", scopeId);
    if (scope === "workflow") q.set("workflow", scopeId);
    return act(
      { title: "Reset this task key?", text: `The next step called with this key (scope ${scope}${scopeId ? " " + scopeId : ""}) runs again instead of reusing its result. The stored key is a hash; enter the key the step was called with.`, ok: "Reset key", input: { label: "Task key", placeholder: "the key given to WithTaskKey" } },
      "Resetting the task key…",
      (key) => api("DELETE", `/v1/task-keys/${encodeURIComponent(key)}?${q}`),
      (d) => `Task key reset (scope ${d.scope}): ${d.deleted} stored result(s) removed.`);
  };

  // rerun plans a rerun of the ended run from its step from (a step ID;
  // "": where it stopped) with POST /v1/runs/{id}/rerun and dry_run, shows
  // the plan in the dialog (the new run's ID, the steps kept and the steps
  // run again), and on confirm asks for that rerun: the plan's step and run
  // ID, so that what starts is what the dialog showed. A plan refused (the
  // run is not ended: 409; a step never reached: 422) is shown as the
  // action's error, and nothing is asked.
  let planning = false;
  const rerun = async (from) => {
    if (planning || $("#confirm").open) return;
    planning = true;
    let p;
    try {
      say("pending", `Planning a rerun of run ${id}…`);
      p = await api("POST", `/v1/runs/${encodeURIComponent(id)}/rerun`, from ? { from, dry_run: true } : { dry_run: true });
    } finally {
      planning = false;
    }
    if (stopped) return;
    if (!p.ok) {
      say(false, problemText(p));
      return;
    }
    result.hidden = true;
    const plan = p.data || {};
    const req = { run_id: plan.run_id };
    if (plan.from) req.from = plan.from;
    return act(
      { title: "Rerun this run?", text: rerunText(run, plan), ok: "Rerun", body: renderRerunPlan(run, plan), wide: true },
      `Starting rerun ${plan.run_id} of run ${id}…`,
      () => api("POST", `/v1/runs/${encodeURIComponent(id)}/rerun`, req),
      rerunDone);
  };

  // expanded holds the values (step outputs, event payloads) shown in
  // full, by their element's ID: a drawing keeps them open.
  const expanded = new Set();
  const actions = { cancel, unblock, accept, startAgain, rerun, resetKey, button, expanded, target };

  // load reads the run and draws it (force: even when unchanged). A read
  // answered after a later one was drawn is dropped: the periodic refresh
  // may ask before an action and be answered after the action's own read.
  async function load(force) {
    const n = ++asked;
    const r = await api("GET", "/v1/runs/" + encodeURIComponent(id));
    if (stopped || n < shown) return;
    shown = n;
    if (!r.ok) {
      last = ""; // the next read draws the run again
      body.replaceChildren(el("div", { class: "result err", id: "run-error-load", role: "alert", text: problemText(r) }));
      return;
    }
    stamp();
    const key = JSON.stringify(r.data);
    if (!force && key === last) {
      // Unchanged: only what moves with the clock is drawn again, so the
      // action buttons stay in place between changes.
      if (active(run.status)) {
        redraw(() => {
          $("#run-duration").textContent = runDuration(run);
          $("#waits")?.replaceWith(renderWaits(run));
          $("#timeline").replaceWith(renderTimeline(run, actions));
        });
      }
      return;
    }
    last = key;
    run = r.data;
    redraw(() => body.replaceChildren(...renderRun(run, actions)));
    if (!scrolled) {
      scrolled = true;
      document.querySelector(`#timeline .step[data-step-id="${CSS.escape(target)}"]`)?.scrollIntoView({ block: "center" });
    }
  }

  // redraw runs draw, keeping the scroll position and the focused control.
  function redraw(draw) {
    const y = window.scrollY;
    let focused = document.activeElement && body.contains(document.activeElement) ? document.activeElement : null;
    draw();
    window.scrollTo(0, y);
    if (focused && !focused.isConnected && focused.id) focused = document.getElementById(focused.id);
    if (focused && focused.isConnected && document.activeElement !== focused) focused.focus();
  }

  return {
    refresh: () => load(false),
    live: () => !run || active(run.status) || (run.open_steps && run.open_steps.length > 0),
    stop: () => { stopped = true; },
  };
}

// stepText names a step of a divergence report: its kind, name and step ID.
function stepText(s) {
  return s ? `${s.kind} ${s.name} (${s.step_id})` : "none";
}

// waivable reports whether a run's block names a step of its history that
// an unblock accepting the divergence can waive (as the server decides:
// the history's step at the place, or the code's own step out of place).
function waivable(block) {
  const d = block && block.divergence;
  return !!d && (!!d.history || (d.kind === "reordered" && !!d.code));
}

function unblockText(id, block) {
  const d = block && block.divergence;
  const where = d ? ` at place ${d.position}` : "";
  return `Run ${id} is replayed with the code the workers run now. If that code still diverges from the run's history${where}, the run is blocked again and nothing runs: deploy code that replays the history first (roll back, or fix the change).`;
}

// acceptText says plainly what accepting the divergence does: which step of
// the history is waived, and which step of the code runs again in its
// place, its side effects repeated.
function acceptText(block) {
  const d = block.divergence;
  const waived = d.history || d.code;
  const head = `The history's ${stepText(waived)} is waived: the run goes on without it. `;
  if (!d.code) return head + `The code starts no step at place ${d.position}: what came after it in the history comes earlier now.`;
  return head + `The step at place ${d.position}, ${d.code.name} (${d.code.step_id}), runs again: its side effects repeat (an email sent again, a charge made again). This cannot be undone.`;
}

// renderBlock shows why a blocked run is blocked: how its code diverges
// from its history, at which place, the history's step and the code's
// there, the build whose code it was, and since when.
function renderBlock(run) {
  const b = run.block;
  const d = b.divergence || {};
  return el("section", { class: "section" }, el("h2", { text: "Blocked" }),
    el("div", { class: "block panel", id: "block", role: "note", "data-since": b.since || "" },
      el("p", { class: "block-why" }, "The run's code diverges from its history (",
        el("span", { class: "mono", text: b.reason || "" }), "): no step runs until code that replays its history takes it, or it is unblocked."),
      el("dl", { class: "facts block-facts" },
        fact("Kind", d.kind || "—", "block-kind"),
        fact("Place", d.position === undefined ? "—" : String(d.position), "block-place"),
        fact("History's step", stepText(d.history), "block-history"),
        fact("Code's step", stepText(d.code), "block-code"),
        fact("Build", b.build || "—", "block-build"),
        fact("Worker", b.worker || "—", "block-worker"),
        fact("Since", timeEl(b.since), "block-since")),
      d.detail ? el("p", { class: "block-detail", id: "block-detail", text: d.detail }) : null,
      waivable(b) ? null : el("p", { class: "muted", id: "block-nothing", text: "Nothing to waive: only code that replays the run moves it on, or cancel it." })));
}

// keyScope reads the scope of a stored task key: r.<run-id>..., w.<workflow>... or g....
function keyScope(stored) {
  const parts = stored.split(".");
  if (parts[0] === "r") return ["run", parts[1]];
  if (parts[0] === "w") return ["workflow", parts[1]];
  return ["global", ""];
}

function runLink(id, text) {
  return el("a", { href: "#/runs/" + encodeURIComponent(id), class: "mono", text: text || id });
}

// attrLinks shows a run's attributes, each a link to the runs that share
// it, in name order (as the API sends them).
function attrLinks(attrs) {
  const entries = Object.entries(attrs || {});
  if (!entries.length) return "—";
  return entries.map(([name, value], i) =>
    [i ? ", " : "", el("a", { href: "#/?" + listQuery({ attrs: { [name]: value } }), title: "runs with " + name + "=" + value, text: name + "=" + value })]);
}

function attrText(attrs) {
  return Object.entries(attrs || {}).map(([name, value]) => name + "=" + value).join(", ");
}

function fact(label, value, id) {
  return el("div", { class: "fact" }, el("dt", { text: label }), el("dd", { id }, value));
}

// runDuration is how long run ran (ended), or has run until now.
function runDuration(run) {
  const end = active(run.status) ? Date.now() : parseTime(run.updated_at);
  return fmtDur(end - parseTime(run.created_at));
}

function renderRun(run, actions) {
  const ended = !active(run.status);
  const head = el("div", { class: "run-head" },
    el("h1", { id: "run-id", text: run.run_id }),
    el("span", { id: "run-status" }, statusLabel(run.status)),
    el("div", { class: "actions" },
      run.status === "blocked" ? actions.button("unblock", { id: "unblock-run", class: "primary", text: "Unblock…", onclick: actions.unblock }) : null,
      run.status === "blocked" && waivable(run.block) ? actions.button("accept", { id: "accept-divergence", class: "danger", text: "Accept divergence…", onclick: actions.accept }) : null,
      active(run.status) ? actions.button("cancel", { id: "cancel-run", class: "danger", text: "Cancel run…", onclick: actions.cancel }) : null,
      rerunnable(run) ? actions.button("rerun", { id: "rerun-run", class: "primary", text: "Rerun…", title: "A new run that keeps the steps that succeeded and runs the rest again", onclick: () => actions.rerun("") }) : null,
      run.status === "failed" || run.status === "cancelled" ? actions.button("start-again", { id: "start-again", class: "secondary", text: "Start again…", title: "Every step again, under the same run ID", onclick: actions.startAgain }) : null));

  const facts = el("dl", { class: "facts panel" },
    fact("Workflow", run.workflow, "run-workflow"),
    fact("Generation", String(run.generation || 0), "run-generation"),
    fact("Source", run.source || "—", "run-source"),
    fact("Attributes", attrLinks(run.attributes), "run-attributes"),
    fact(ended ? "Duration" : run.status === "running" ? "Running for" : "Age", runDuration(run), "run-duration"),
    fact("Started", timeEl(run.created_at, "run-started")),
    fact(ended ? "Ended" : "Last status change", timeEl(run.updated_at, "run-updated")),
    fact("Parent", run.parent ? runLink(run.parent.run_id) : "—", "run-parent"),
    fact("Children", run.children && run.children.length ? run.children.map((c, i) => [i ? ", " : "", runLink(c.run_id)]) : "—", "run-children"));

  if (run.waived && run.waived.length) facts.append(fact("Waived", run.waived.join(", "), "run-waived"));
  if (run.rerun_of) facts.append(fact("Rerun of", rerunOfView(run.rerun_of), "run-rerun-of"));
  if (run.reruns && run.reruns.length) facts.append(fact("Reruns", rerunsView(run.reruns), "run-reruns"));
  const out = [head, facts];
  if (run.block) out.push(renderBlock(run));
  if (run.error) {
    out.push(el("div", { class: "run-error", id: "run-error", role: "note" },
      el("span", { class: "kind", text: run.error.kind || "error" }), el("pre", { text: run.error.message || "" })));
  }
  if (run.waits && run.waits.length) {
    out.push(el("section", { class: "section" }, el("h2", { text: "Waiting for" }), renderWaits(run)));
  }
  out.push(el("section", { class: "section" }, el("h2", { text: "Timeline" }), renderTimeline(run, actions)));
  out.push(renderDuplicates(run));
  out.push(el("section", { class: "section io" },
    el("div", {}, el("h2", { text: "Input" }), el("pre", { id: "run-input", tabIndex: 0, text: pretty(run.input) })),
    el("div", {}, el("h2", { text: "Output" }), el("pre", { id: "run-output", tabIndex: 0, text: pretty(run.output) }))));
  return out;
}

// ---- reruns ------------------------------------------------------------------

// rerunnable reports whether a run can be rerun: it has ended.
function rerunnable(run) {
  return run.status === "completed" || run.status === "failed" || run.status === "cancelled";
}

// stepLabel names a step by its step ID (<run identity>.<name>.<n>): its
// name, and which call of it when it is not the first.
function stepLabel(stepID) {
  const parts = (stepID || "").split(".");
  if (parts.length < 3) return stepID || "";
  const n = Number(parts[parts.length - 1]);
  const name = parts[parts.length - 2];
  return n > 0 ? `${name} (call ${n + 1})` : name;
}

// stepLink links to the step stepID on the page of the run runID, where
// the timeline marks it.
function stepLink(runID, stepID, attrs) {
  return el("a", { href: "#/runs/" + encodeURIComponent(runID) + "?step=" + encodeURIComponent(stepID), title: stepID, text: stepLabel(stepID), ...attrs });
}

// rerunOfView shows a rerun's source: the run (its generation when not the
// first) and the step it was rerun from.
function rerunOfView(of) {
  return [runLink(of.run_id), of.generation ? ` (generation ${of.generation})` : "", " from ",
    of.from ? stepLink(of.run_id, of.from, { class: "mono rerun-of-step" }) : el("span", { class: "muted", text: "after its last step" })];
}

// rerunsView lists a run's reruns (the last ten its audit keeps), each a
// link to the rerun; its tooltip says from which step, when and who asked.
function rerunsView(reruns) {
  return reruns.map((r, i) => [i ? ", " : "", el("a", {
    href: "#/runs/" + encodeURIComponent(r.run_id), class: "mono rerun", "data-from": r.from || "",
    title: `from ${r.from || "after the last step"} · ${fmtTime(r.at)}` + (r.source ? ` · by ${r.source}` : ""), text: r.run_id,
  })]);
}

const stepCount = (n) => (n === 1 ? "1 step" : `${n} steps`);

// rerunText says what a rerun of run starts, by its plan (a dry run).
function rerunText(run, plan) {
  const head = `A new run, ${plan.run_id}, of ${run.workflow} starts with this run's input and the code the workers run now. `;
  if (!plan.from) return head + "It keeps every step this run committed: none of them runs again, only what the code calls after them runs. To run a step again, use \"Rerun from here…\" on it in the timeline.";
  return head + `It keeps the steps this run committed before ${stepLabel(plan.from)} (${plan.from}), which never run again, and runs ${stepLabel(plan.from)} and every step after it again, under new step IDs: their side effects repeat.`;
}

// renderRerunPlan lists a rerun's plan in its dialog: the new run's ID,
// the steps kept (never run again) and the steps run again under the new
// run's step IDs.
function renderRerunPlan(run, plan) {
  const kept = plan.kept || [];
  const again = plan.again || [];
  const list = (id, steps, none) => steps.length
    ? el("ul", { id, class: "plan-steps" }, steps.map((s) => el("li", { "data-step-id": s.step_id },
      el("span", { class: "step-name", text: s.name }),
      s.kind ? el("span", { class: "kind", text: s.kind }) : null,
      s.error && s.code !== "event_timeout" ? el("span", { class: "kind failed", text: "failed" }) : null,
      el("span", { class: "mono step-id", text: s.step_id }))))
    : el("p", { id, class: "muted plan-none", text: none });
  const existing = (run.reruns || []).some((r) => r.run_id === plan.run_id);
  return [
    el("p", { class: "plan-run" }, "New run ID: ", el("span", { class: "mono", id: "rerun-id", text: plan.run_id })),
    existing ? el("p", { class: "plan-existing", id: "rerun-existing", text: `Run ${plan.run_id} exists already: rerunning shows it and starts nothing. To run these steps once more, rerun under another run ID (the API's run_id).` }) : null,
    el("h3", { class: "plan-head kept" }, "Kept: never run again ", el("span", { class: "muted", text: `(${stepCount(kept.length)})` })),
    list("rerun-kept", kept, "None: every step of this run runs again."),
    el("h3", { class: "plan-head again" }, "Run again under new step IDs: their side effects repeat ", el("span", { class: "muted", text: `(${stepCount(again.length)})` })),
    list("rerun-again", again, "None of this run's steps: only what the code calls after its last one."),
  ];
}

// rerunDone says what a rerun did: created, or found existing (a repeat),
// with a link to the new run.
function rerunDone(d) {
  const st = d.start || {};
  const link = el("a", { id: "rerun-link", class: "mono", href: "#/runs/" + encodeURIComponent(d.run_id), text: d.run_id });
  if (st.outcome === "created") return ["Rerun ", link, ` created (${st.status}): ${stepCount((d.kept || []).length)} kept, ${stepCount((d.again || []).length)} run again.`];
  if (st.outcome === "existing") return ["Rerun ", link, ` exists already (${st.status}): nothing new started.`];
  return ["Rerun ", link, `: ${st.outcome || "?"}, status ${st.status || "?"}.`];
}

function renderDuplicates(run) {
  const rows = [];
  if (run.first_duplicate) rows.push(["first", run.first_duplicate]);
  for (const d of run.recent_duplicates || []) {
    if (run.first_duplicate && d.at === run.first_duplicate.at && d.source === run.first_duplicate.source) continue;
    rows.push(["recent", d]);
  }
  const n = run.duplicates || 0;
  const title = el("h2", {}, "Duplicate starts ", el("span", { class: "muted num", id: "duplicates-count", text: String(n) }));
  if (!n) return el("section", { class: "section" }, title, el("p", { class: "muted", text: "None: every start of this run ID created it." }));
  return el("section", { class: "section" }, title,
    el("div", { class: "panel" }, el("table", { class: "grid-table", id: "duplicates" },
      el("thead", {}, el("tr", {}, ["When", "Source", "Outcome", "Fingerprint match", "Run status seen"].map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, rows.map(([, d]) => el("tr", { class: "dup" },
        el("td", {}, timeEl(d.at)), el("td", { text: d.source || "—" }), el("td", { text: d.outcome }),
        el("td", {}, d.fingerprint_match ? el("span", { class: "yes", text: "yes" }) : el("span", { class: "no", text: "no" })),
        el("td", {}, d.status ? statusLabel(d.status) : "—")))))),
    n > rows.length ? el("p", { class: "muted", text: `${n - rows.length} more not kept in the audit summary.` }) : null);
}

// renderTimeline draws a bar per attempt on a time axis from the run's
// start: committed steps in call order, then the open ones, then the open
// waits, each a bar from its start to now and on to its deadline.
function renderTimeline(run, actions) {
  const steps = run.steps || [];
  const open = run.open_steps || [];
  const waits = run.waits || [];
  // A step is written when it commits or fails, a wait when it begins: a
  // step running for the first time has nothing to show.
  if (!steps.length && !open.length && !waits.length) {
    return el("div", { class: "panel empty", id: "timeline",
      text: active(run.status) ? "No step has committed or failed yet (a step running or waiting for the first time shows once it does)." : "No step committed or failed." });
  }
  const t0 = parseTime(run.created_at);
  const now = Date.now();
  const items = [];
  let tEnd = active(run.status) ? now : parseTime(run.updated_at) || now;
  let tStart = t0;
  const span = (a, b) => { if (a !== null) tStart = Math.min(tStart, a); if (b !== null) tEnd = Math.max(tEnd, b); };

  for (const s of steps) {
    const atts = failedAttempts(s.attempts);
    const committed = parseTime(s.committed_at);
    const started = parseTime(s.started_at);
    // Every attempt that failed is labelled so, the committed one too (a
    // step that failed for good); a wait whose timeout passed ended as the
    // workflow asked: it timed out.
    const timedOutWait = s.code === "event_timeout";
    const failed = !!s.error && !timedOutWait;
    let cls = failed ? "failed" : "";
    if (!failed && (s.kind === "sleep" || s.kind === "event" || s.kind === "hook")) cls = "wait";
    if (s.task_key && s.task_key.served) cls = "served";
    atts.push({ n: s.attempt, start: started, end: committed, worker: s.worker, error: s.error, cls, failed, committed: true,
      note: timedOutWait ? "timed out" : undefined });
    atts.forEach((a) => span(a.start, a.end));
    items.push({ s, atts, open: false });
  }
  for (const o of open) {
    const atts = failedAttempts(o.attempts);
    const prevEnd = atts.length ? atts[atts.length - 1].end : null;
    atts.forEach((a) => span(a.start, a.end));
    if (run.status === "running") {
      // The latest attempt started either failed (the step waits for its
      // retry: the next attempt is pending) or runs now.
      const lastFailed = atts.length ? atts[atts.length - 1].n : 0;
      const pending = lastFailed >= o.attempt;
      atts.push({ n: pending ? lastFailed + 1 : o.attempt, start: prevEnd, end: now, cls: "open", note: pending ? "retry pending" : "running" });
    }
    items.push({ s: o, atts, open: true });
  }
  for (const w of waits) {
    span(parseTime(w.since), now);
    items.push({ s: w, wait: true });
  }
  // The axis runs on past now to the waits' deadlines, at most as far
  // again as the run has run, so that its steps stay readable: a bar
  // whose deadline lies further is drawn to the axis's end, open-ended.
  let axisEnd = tEnd;
  const ahead = tEnd + Math.max(tEnd - tStart, 1000);
  for (const w of waits) {
    const until = parseTime(w.until);
    if (until !== null) axisEnd = Math.max(axisEnd, Math.min(until, ahead));
  }
  const total = Math.max(axisEnd - tStart, 1);
  const pct = (t) => ((t - tStart) / total) * 100;
  const place = (bar, a, b) => {
    bar.style.left = pct(a) + "%";
    bar.style.width = Math.max(pct(b) - pct(a), 0.3) + "%";
  };

  const axis = el("div", { class: "axis", "aria-hidden": "true" }, el("span", { text: "Step / attempt" }),
    el("div", { class: "axis-track" }, [0, 0.25, 0.5, 0.75, 1].map((f) => {
      const t = el("span", { class: "tick", text: "+" + fmtDur(total * f) });
      t.style.left = f * 100 + "%";
      return t;
    })), el("span", { class: "tl-dur", text: "duration" }));

  const legend = el("div", { class: "legend", "aria-hidden": "true" }, [
    ["", "attempt committed"], ["failed", "attempt failed"], ["open", "running or retry pending"], ["served", "served from a task key"],
    ["wait", "wait over"], ["waiting", "waiting, until now"], ["wait-left", "until its deadline"],
  ].map(([cls, text]) => el("span", { class: "legend-item" }, el("span", { class: "swatch bar " + cls }), text)));

  return el("div", { class: "panel timeline", id: "timeline" }, axis, items.map(({ s, atts, open: isOpen, wait }) => {
    if (wait) return renderWaitStep(s, now, axisEnd, place);
    // A committed step of an ended run can be rerun from (a patch marker
    // is no step to run).
    const rerunFrom = !isOpen && rerunnable(run) && s.kind !== "patch";
    const head = el("div", { class: "step-head" },
      el("span", { class: "step-name", text: s.name }),
      s.kind ? el("span", { class: "kind", text: s.kind }) : null,
      isOpen ? el("span", { class: "kind open", text: run.status === "running" ? "open" : "not committed" }) : null,
      el("span", { class: "idem" }, el("b", { text: "Idempotency-Key: " }), el("span", { class: "step-id", text: s.step_id })),
      rerunFrom ? actions.button("rerun-from " + s.step_id, { class: "link rerun-from", "data-step-id": s.step_id, text: "Rerun from here…",
        title: "A new run that keeps the steps before this one and runs this one and the rest again", onclick: () => actions.rerun(s.step_id) }) : null);
    const rows = atts.map((a) => {
      const bar = el("div", { class: "bar " + a.cls, title: a.error ? `attempt ${a.n}: ${a.error}` : `attempt ${a.n}` });
      const start = a.start ?? a.end;
      if (start !== null && a.end !== null) place(bar, start, a.end);
      const label = `attempt ${a.n}` + (a.failed ? " · failed" : a.note ? " · " + a.note : "") + (a.worker ? " · " + a.worker : "");
      return el("div", { class: "tl-row attempt" + (a.failed ? " attempt-failed" : ""), "data-step-id": s.step_id, "data-attempt": String(a.n) },
        el("span", { class: "tl-label", title: label, text: label }),
        el("div", { class: "tl-track" }, bar),
        el("span", { class: "tl-dur", text: a.start !== null && a.end !== null ? fmtDur(a.end - a.start) : "—" }));
    });
    const notes = el("div", { class: "step-notes" });
    // A wait whose timeout passed (code event_timeout) ended as the
    // workflow asked: "timed out", not an error.
    const timedOut = s.code === "event_timeout";
    for (const a of atts) if (a.error && !(a.committed && timedOut)) notes.append(el("div", { class: "err", text: `attempt ${a.n}: ${a.error}` + (a.committed && s.fatal ? " (fatal, not retried)" : "") }));
    if (s.kind === "sleep") notes.append(el("div", { class: "note" }, "sleep until ", timeEl(s.wake_at)));
    if ((s.kind === "event" || s.kind === "hook") && s.event_id) notes.append(el("div", { class: "note" }, "event ", el("span", { class: "mono event-id", text: s.event_id })));
    if (timedOut) notes.append(el("div", { class: "note timed-out" }, "timed out: " + (s.error || ""), parseTime(s.wake_at) ? [" (at ", timeEl(s.wake_at), ")"] : null));
    else if ((s.kind === "event" || s.kind === "hook") && !s.event_id && parseTime(s.wake_at)) notes.append(el("div", { class: "note" }, "timed out at ", timeEl(s.wake_at)));
    if (s.kind === "hook" && s.hook_token) notes.append(el("div", { class: "note" }, "hook token ", el("span", { class: "mono", text: s.hook_token })));
    if (s.child) notes.append(el("div", { class: "note" }, "child run ", runLink(s.child)));
    if (s.task_key) {
      const tk = s.task_key;
      notes.append(el("div", { class: "note task-key" }, "task key ", el("span", { class: "mono", text: tk.key }), " · ",
        tk.served ? el("span", { class: "hit", text: "hit" }) : el("span", { class: "miss", text: "miss" }),
        tk.served && tk.from ? [" (result of ", el("span", { class: "mono", text: tk.from }), ")"] : null, " ",
        actions.button("reset-key " + s.step_id, { class: "link reset-key", text: "Reset key…", onclick: () => actions.resetKey(tk) })));
    }
    // What the step returned; for a wait that took an event, the event's
    // payload (a sleep's is its deadline, shown above).
    if (!isOpen && s.output !== undefined && s.kind !== "sleep") {
      notes.append(el("div", { class: "note value-note" }, s.event_id ? "payload " : "output ",
        valueView(s.output, "value:" + s.step_id, actions.expanded)));
    }
    return el("div", { class: "step" + (isOpen ? " open-step" : "") + (actions.target && s.step_id === actions.target ? " target" : ""), "data-step-id": s.step_id }, head, rows, notes.childNodes.length ? notes : null);
  }), legend);
}

// failedAttempts are a step's attempts that failed and were retried
// (StepAttempt), as the timeline draws them.
function failedAttempts(list) {
  return (list || []).map((a) => ({ n: a.attempt, start: parseTime(a.started_at), end: parseTime(a.ended_at), worker: a.worker, error: a.error, cls: "failed", failed: true }));
}

// renderWaitStep draws an open wait in the timeline: a bar from its start
// to now (waiting), and on from now to its deadline (left), or to the
// axis's end (beyond) when the deadline lies past it; no deadline, no
// second bar.
function renderWaitStep(w, now, axisEnd, place) {
  const since = parseTime(w.since);
  const until = parseTime(w.until);
  const track = el("div", { class: "tl-track" });
  const waiting = el("div", { class: "bar waiting", title: `waiting since ${fmtTime(w.since)}` });
  if (since !== null) place(waiting, since, now);
  track.append(waiting);
  let label = "waiting · no deadline";
  if (until !== null && until > now) {
    const left = el("div", { class: "bar wait-left" + (until > axisEnd ? " beyond" : ""), title: `until ${fmtTime(w.until)} (${relTime(until)})` });
    place(left, now, Math.min(until, axisEnd));
    track.append(left);
    label = "waiting · deadline " + relTime(until);
  } else if (until !== null) {
    label = "waiting · deadline passed";
  }
  const head = el("div", { class: "step-head" },
    el("span", { class: "step-name", text: w.name }),
    el("span", { class: "kind", text: w.kind }),
    el("span", { class: "kind waiting", text: "waiting" }),
    el("span", { class: "idem" }, el("b", { text: "Step ID: " }), el("span", { class: "step-id", text: w.step_id })));
  const row = el("div", { class: "tl-row wait-row", "data-step-id": w.step_id },
    el("span", { class: "tl-label", title: label, text: label }),
    track,
    el("span", { class: "tl-dur", text: since !== null ? fmtDur(now - since) : "—" }));
  const notes = el("div", { class: "step-notes" },
    el("div", { class: "note" }, "waits for ", waitWhat(w), " · since ", timeEl(w.since), " · ",
      until !== null ? ["until ", timeEl(w.until)] : el("span", { class: "no-deadline", text: "no deadline" })));
  return el("div", { class: "step open-wait", "data-step-id": w.step_id, "data-kind": w.kind }, head, row, notes);
}

// waitWhat says what an open wait waits for.
function waitWhat(w) {
  switch (w.kind) {
    case "sleep":
      return "the sleep's end";
    case "event":
      return ["event ", el("span", { class: "mono wait-event", text: w.event || "" })];
    case "hook":
      return ["a resume of hook token ", el("span", { class: "mono wait-token", text: w.hook_token || "" }),
        w.event ? [" (event ", el("span", { class: "mono wait-event", text: w.event }), ")"] : null];
    case "child":
      return ["child run ", w.child_run_id ? el("a", { href: "#/runs/" + encodeURIComponent(w.child_run_id), class: "mono wait-child", text: w.child_run_id }) : "—", " to end"];
    default:
      return w.kind || "—";
  }
}

// renderWaits lists what a running run waits for: for each open wait, what
// (kind, event, hook token, child run), since when and until when.
function renderWaits(run) {
  const now = Date.now();
  return el("div", { class: "panel", id: "waits" }, el("table", { class: "grid-table waits" },
    el("thead", {}, el("tr", {}, ["Step", "Waits for", "Since", "Until"].map((h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, (run.waits || []).map((w) => {
      const since = parseTime(w.since);
      const until = parseTime(w.until);
      return el("tr", { class: "wait", "data-step-id": w.step_id, "data-kind": w.kind },
        el("td", { class: "w-step" }, el("span", { class: "step-name", text: w.name }), " ", el("span", { class: "kind", text: w.kind })),
        el("td", { class: "w-what" }, waitWhat(w)),
        el("td", { class: "w-since" }, timeEl(w.since), since !== null ? el("span", { class: "rel", text: " · for " + fmtDur(now - since) }) : null),
        el("td", { class: "w-until" }, until !== null
          ? [timeEl(w.until), el("span", { class: "rel", text: " · " + (until > now ? fmtDur(until - now) + " left" : "passed") })]
          : el("span", { class: "no-deadline", text: "no deadline" })));
    }))));
}

// VALUE_INLINE is the longest value (as compact JSON) shown in line; a
// longer one is collapsed to its beginning, and shown in full on a click.
const VALUE_INLINE = 80;

// valueView shows a JSON value of the API as text (never as HTML): in line
// when short, else collapsed. id names it in expanded, the values shown
// in full, which a drawing keeps open.
function valueView(v, id, expanded) {
  const compact = JSON.stringify(v);
  if (compact === undefined) return el("code", { class: "value", text: "—" });
  if (compact.length <= VALUE_INLINE) return el("code", { class: "value", id, text: compact });
  const d = el("details", { class: "value", id, open: expanded.has(id) },
    el("summary", { id: id + ":summary" }, el("code", { text: compact.slice(0, VALUE_INLINE - 20) + "…" }),
      el("span", { class: "muted size", text: ` ${compact.length} characters` })),
    el("pre", { tabIndex: 0, text: pretty(v) }));
  d.addEventListener("toggle", () => { if (d.open) expanded.add(id); else expanded.delete(id); });
  return d;
}

// ---- workers -----------------------------------------------------------------

// workersView shows who serves what now (GET /v1/workers): the workers
// running, each with the workflows it serves and its latest heartbeat, and
// every workflow the deployment knows, with the workers serving it now
// (none: its starts wait for a worker).
function workersView() {
  let stopped = false;
  const error = el("div", { class: "result err", id: "workers-error", role: "alert", hidden: true });
  const workers = el("tbody", { id: "workers-body" });
  const workflows = el("tbody", { id: "workflows-body" });
  const head = (...names) => el("thead", {}, el("tr", {}, names.map((h) => el("th", { scope: "col", text: h }))));
  const noWorkers = el("p", { class: "muted", id: "workers-empty", text: "No worker is running: no liveness record is current.", hidden: true });
  $("#view").replaceChildren(
    el("h1", { class: "page-title", text: "Workers" }), error,
    el("section", { class: "section" }, el("h2", { text: "Running now" }),
      el("div", { class: "panel" }, el("table", { class: "grid-table roster", id: "workers" }, head("Worker", "ID", "Serves", "Build", "Since", "Latest heartbeat"), workers)), noWorkers),
    el("section", { class: "section" }, el("h2", { text: "Workflows" }),
      el("div", { class: "panel" }, el("table", { class: "grid-table roster", id: "workflows" }, head("Workflow", "Served now by", "First served by", "First served"), workflows))),
    el("p", { class: "muted", text: "A running worker keeps a liveness record per workflow it serves, rewritten by its heartbeat; a stopped worker withdraws them, a dead one's expire within its liveness TTL. A workflow stays known once a worker has served it." }),
    engineSection());

  async function load() {
    const r = await api("GET", "/v1/workers");
    if (stopped) return;
    if (!r.ok) {
      error.textContent = problemText(r);
      error.hidden = false;
      return;
    }
    error.hidden = true;
    stamp();
    const d = r.data || {};
    workers.replaceChildren(...(d.workers || []).map((w) => el("tr", { "data-worker-id": w.id },
      el("td", { class: "w-name", text: w.name }),
      el("td", { class: "w-id mono", text: w.id }),
      el("td", { class: "w-serves" }, (w.workflows || []).map((name, i) => [i ? ", " : "", el("a", { href: "#/?" + listQuery({ workflow: name }), title: "runs of " + name, text: name })])),
      el("td", { class: "w-build mono", text: (w.build || "—") + (w.protocol === 3 ? "" : ` (engine protocol ${w.protocol || "before 3"})`) }),
      el("td", {}, timeEl(w.since)),
      el("td", {}, timeEl(w.beat)))));
    noWorkers.hidden = (d.workers || []).length > 0;
    workflows.replaceChildren(...(d.workflows || []).map((wf) => el("tr", { "data-workflow": wf.workflow },
      el("td", { class: "wf-name" }, el("a", { href: "#/?" + listQuery({ workflow: wf.workflow }), title: "runs of " + wf.workflow, text: wf.workflow })),
      el("td", { class: "wf-workers" }, wf.workers && wf.workers.length ? wf.workers.join(", ") : el("span", { class: "no-worker", text: "no worker: its starts wait for one" })),
      el("td", { class: "wf-first", text: wf.first_worker || "—" }),
      el("td", {}, timeEl(wf.first_served)))));
  }

  return {
    refresh: load,
    live: () => true,
    stop: () => { stopped = true; },
  };
}

// engineSection counts, when asked (GET /v1/engine reads every kept run
// record), the runs under way by workflow and the build that started
// them, and names the live workers of another engine protocol, beside
// which no worker of this version executes anything.
function engineSection() {
  const out = el("div", { id: "engine-result" });
  const button = el("button", { type: "button", id: "engine-count", text: "Count runs by build" });
  button.addEventListener("click", async () => {
    button.disabled = true;
    const r = await api("GET", "/v1/engine");
    button.disabled = false;
    if (!r.ok) {
      out.replaceChildren(el("div", { class: "result err", role: "alert", text: problemText(r) }));
      return;
    }
    const d = r.data || {};
    const rows = [];
    for (const [wf, builds] of Object.entries(d.builds || {}).sort()) {
      for (const [build, n] of Object.entries(builds).sort()) {
        rows.push(el("tr", { "data-workflow": wf, "data-build": build },
          el("td", { text: wf }), el("td", { class: "mono", text: build || "(not recorded yet)" }), el("td", { class: "num", text: String(n) })));
      }
    }
    const foreign = (d.foreign || []).map((f) => `${f.name} (engine protocol ${f.protocol || "before 3"})`);
    out.replaceChildren(
      foreign.length ? el("div", { class: "result err", id: "engine-foreign", role: "alert", text: `Workers of another engine protocol are live: ${foreign.join(", ")}. No worker of this version executes anything until they stop.` }) : "",
      d.legacy_runs ? el("p", { id: "engine-legacy", text: `${d.legacy_runs} runs of the executor before the lease are not taken over yet (each is when its next message comes due).` }) : "",
      rows.length
        ? el("div", { class: "panel" }, el("table", { class: "grid-table", id: "engine-builds" },
          el("thead", {}, el("tr", {}, ["Workflow", "Build", "Runs under way"].map((h) => el("th", { scope: "col", text: h })))), el("tbody", {}, rows)))
        : el("p", { class: "muted", id: "engine-none", text: "No run is under way." }));
  });
  return el("section", { class: "section" }, el("h2", { text: "Engine" }),
    el("p", { class: "muted", text: "The runs under way by the build that started them: the runs a build's workers hold (a pinned workflow's stay on their build). Counting reads every kept run." }),
    button, out);
}

// ---- start -----------------------------------------------------------------

document.addEventListener("keydown", (e) => {
  if (e.key !== "/" || e.ctrlKey || e.metaKey || e.altKey) return;
  const t = e.target;
  if (t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement || t instanceof HTMLSelectElement || $("#confirm").open) return;
  e.preventDefault();
  if ($("#search")) {
    $("#search").focus();
    return;
  }
  location.hash = "#/"; // the list, then its search box
  requestAnimationFrame(() => $("#search") && $("#search").focus());
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && view) view.refresh();
  schedule();
});

window.addEventListener("hashchange", route);
route();
