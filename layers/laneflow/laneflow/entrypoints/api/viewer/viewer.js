"use strict";
const base = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
const $ = (id) => document.getElementById(id);
let shown = null, timer = null;

function el(tag, opts, ...kids) {
  const e = document.createElement(tag);
  if (opts && opts.cls) e.className = opts.cls;
  if (opts && opts.title) e.title = opts.title;
  if (opts && opts.onclick) e.addEventListener("click", opts.onclick);
  for (const k of kids) e.append(k instanceof Node ? k : String(k == null ? "" : k));
  return e;
}
const usd = (x) => "$" + Number(x || 0).toFixed(4);
const status = (s) => el("span", {cls: "s " + s}, s);
const short = (v) => v == null ? "" : (typeof v === "string" ? v : JSON.stringify(v));

async function get(path) {
  const token = sessionStorage.getItem("laneflow-token");
  const r = await fetch(base + path, {headers: token ? {Authorization: token} : {}});
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.message || ("HTTP " + r.status));
  return body;
}

function table(head, rows) {
  return el("table", null, el("thead", null, el("tr", null, ...head.map((h) => el("th", null, h)))),
            el("tbody", null, ...rows));
}

async function listRuns() {
  const out = $("runs");
  try {
    const {runs} = await get("runs?limit=100");
    out.replaceChildren(runs.length ? table(["run", "flow", "status", "cost"], runs.map((r) => {
      const tr = el("tr", {cls: "run" + (r.id === shown ? " on" : ""), onclick: () => { location.hash = encodeURIComponent(r.id); }},
        el("td", {title: r.created_at}, r.id), el("td", null, r.workspace + " / " + r.flow), el("td", null, status(r.status)),
        el("td", null, usd(r.cost_usd)));
      return tr;
    })) : el("p", {cls: "muted"}, "No runs yet."));
  } catch (e) { out.replaceChildren(el("p", {cls: "err"}, "Cannot list runs: " + e.message)); }
}

function layers(step) {
  return el("ul", null, ...(step.prompt_layers || []).map((l) =>
    el("li", {title: "sha256 " + l.sha256}, l.name + ": " + l.chars + " chars" + (l.dynamic ? " (dynamic)" : ""))));
}

function details(step) {
  const d = el("details", null, el("summary", null, (step.events || []).length + " events, " + (step.calls || []).length + " model calls"));
  if (step.result) d.append(el("pre", null, step.result));
  if (step.error) d.append(el("pre", {cls: "err"}, step.error));
  d.append(el("ul", null, ...(step.events || []).map((e) => el("li", null, el("span", {cls: "muted"}, e.t + " "), e.text))));
  d.append(el("ul", null, ...(step.calls || []).map((c) => el("li", null,
    "call " + c.n + ": " + c.model + ", " + c.ms + " ms, tokens in " + c.tokens.input + " / out " + c.tokens.output +
    " / cache read " + c.tokens.cache_read + " / cache write " + c.tokens.cache_write + ", " + usd(c.cost_usd)))));
  return d;
}

async function showRun(id) {
  shown = id; clearTimeout(timer);
  const out = $("run");
  if (!id) { out.replaceChildren(el("p", {cls: "muted"}, "Choose a run.")); return; }
  try {
    const run = await get("runs/" + encodeURIComponent(id));
    out.replaceChildren(
      el("h2", null, run.id, " ", status(run.status)),
      el("p", null, run.workspace + " / " + run.flow + " — " + usd(run.cost_usd) + ", " + run.drives + " drive(s), created " +
        run.created_at + (run.finished_at ? ", finished " + run.finished_at : "")),
      run.error ? el("p", {cls: "err"}, run.error) : "",
      el("pre", null, "input: " + JSON.stringify(run.input)),
      table(["#", "group", "agent", "item", "model", "status", "attempts", "cost", "prompt layers", "trace"], run.steps.map((s) =>
        el("tr", null, el("td", null, s.index), el("td", null, s.group), el("td", null, s.agent == null ? "(approval)" : s.agent),
          el("td", null, short(s.item)), el("td", null, s.model), el("td", null, status(s.status), s.skip_reason ? el("div", {cls: "muted"}, s.skip_reason) : ""),
          el("td", null, s.attempts), el("td", null, usd(s.cost_usd)), el("td", null, layers(s)), el("td", null, details(s)))))
    );
    if (!["completed", "failed"].includes(run.status)) timer = setTimeout(() => showRun(id), 3000);
  } catch (e) { out.replaceChildren(el("p", {cls: "err"}, "Cannot show " + id + ": " + e.message)); }
  listRuns();
}

function route() { showRun(decodeURIComponent(location.hash.slice(1))); }
$("token").value = sessionStorage.getItem("laneflow-token") || "";
$("token").addEventListener("change", (e) => { sessionStorage.setItem("laneflow-token", e.target.value.trim()); route(); });
$("refresh").addEventListener("click", route);
window.addEventListener("hashchange", route);
route();
