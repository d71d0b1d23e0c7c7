// The run viewer: a live list of runs at `#/`, a run's page at `#/runs/ID`. Preact + htm,
// vendored (assets/VENDORED.md), no build step. Everything a record holds is rendered as
// text by Preact (never as HTML). Live: a run's page follows `GET runs/ID/stream`
// (server-sent events, `laneflow serve`), else it polls (API Gateway cannot stream).
import { h, render } from "preact";
import { useCallback, useEffect, useMemo, useState } from "preact/hooks";
import htm from "htm";
import * as m from "./model.js";
import * as signin from "./signin.js";

const html = htm.bind(h);
const BASE = document.getElementById("app").dataset.base || "";
const POLL_MS = 2000;

// -- talking to the API -------------------------------------------------------------------------

const authHeader = signin.idToken; // the signed-in person's ID token, or null (signin.js)

async function api(path, opts = {}) {
  const headers = { Accept: "application/json" };
  const token = await signin.authorization(); // with none good, the person signs in again
  if (token) headers.Authorization = token;
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(BASE + "/" + path, { method: opts.method || "GET", headers, body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  } catch (e) {
    throw Object.assign(new Error("the API cannot be reached (offline?)"), { offline: true });
  }
  await signin.answered(r.status); // a 401 signs the person in again
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw Object.assign(new Error(body.message || "HTTP " + r.status), { status: r.status });
  return body;
}

function useNow(active) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    if (!active) return undefined;
    const t = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(t);
  }, [active]);
  return now;
}

function useRoute() {
  const read = () => {
    const hit = /^#\/runs\/(.+)$/.exec(location.hash);
    return hit ? { page: "run", id: decodeURIComponent(hit[1]) } : { page: "list" };
  };
  const [route, setRoute] = useState(read);
  useEffect(() => {
    const on = () => setRoute(read());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return route;
}

// -- small pieces -------------------------------------------------------------------------------

const Status = ({ s, label }) => html`<span class=${"pill st-" + s}>${label || s}</span>`;

const Fact = ({ k, v, title }) => html`<div class="fact" title=${title || ""}><dt>${k}</dt><dd>${v}</dd></div>`;

function Actions({ run, onDone }) {
  const [busy, setBusy] = useState("");
  const [said, setSaid] = useState(null);
  const act = async (what, path, body) => {
    if (what === "stop" && !confirm(`Stop run ${run.id}? Stopping is one-way.`)) return;
    setBusy(what);
    setSaid(null);
    try {
      const out = await api(path, { method: "POST", body });
      setSaid({ ok: true, text: out.message || (what === "approve" ? "approved: the run goes on" : what === "reject" ? "rejected: the run failed" : "done") });
      onDone && onDone();
    } catch (e) {
      setSaid({ ok: false, text: e.message });
    } finally {
      setBusy("");
    }
  };
  const id = encodeURIComponent(run.id);
  const parked = run.status === "awaiting-approval";
  return html`<div class="actions">
    ${parked && html`<button class="approve" disabled=${!!busy} onClick=${() => act("approve", `runs/${id}/approval`, { approve: true })}>Approve</button>
      <button class="reject" disabled=${!!busy} onClick=${() => act("reject", `runs/${id}/approval`, { approve: false })}>Reject</button>`}
    ${!m.ENDED.has(run.status) && html`<button class="stop" disabled=${!!busy || run.stop_requested} onClick=${() => act("stop", `runs/${id}/stop`)}>${run.stop_requested ? "Stopping…" : "Stop"}</button>`}
    ${said && html`<span role="status" class=${said.ok ? "said" : "said err"}>${said.text}</span>`}
  </div>`;
}

function Sparkline({ series, width = 160, height = 34 }) {
  if (series.length < 3) return null; // a line needs at least two calls to say anything
  const t0 = series[0][0], t1 = series[series.length - 1][0] || t0 + 1, top = series[series.length - 1][1] || 1;
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (width - 2) + 1, y = (c) => height - 2 - (c / top) * (height - 4);
  let d = `M${x(series[0][0]).toFixed(1)},${y(0).toFixed(1)}`;
  for (const [t, c] of series.slice(1)) d += `H${x(t).toFixed(1)}V${y(c).toFixed(1)}`;
  const area = `${d}V${y(0).toFixed(1)}Z`;
  return html`<svg class="spark" viewBox=${`0 0 ${width} ${height}`} width=${width} height=${height} role="img" aria-label="the run's cost as it grew">
    <title>the run's cost as it grew</title><path class="area" d=${area} /><path d=${d} /></svg>`;
}

// -- the list -----------------------------------------------------------------------------------

const FILTERS = [["all", () => true], ["active", (r) => !m.ENDED.has(r.status)], ["awaiting-approval", (r) => r.status === "awaiting-approval"],
  ["failed", (r) => r.status === "failed"], ["completed", (r) => r.status === "completed"]];

function RunList({ live }) {
  const [runs, setRuns] = useState(null);
  const [filter, setFilter] = useState(() => sessionStorage.getItem("laneflow-filter") || "all");
  const choose = (f) => { sessionStorage.setItem("laneflow-filter", f); setFilter(f); };
  const [error, setError] = useState(null);
  const now = useNow(true);
  const load = useCallback(async () => {
    try {
      setRuns((await api("runs?limit=100")).runs);
      setError(null);
      live.set(navigator.onLine ? "live" : "offline");
    } catch (e) {
      setError(e);
      live.set(e.offline ? "offline" : "error");
    }
  }, []);
  useEffect(() => {
    load();
    const t = setInterval(() => document.hidden || load(), POLL_MS);
    return () => clearInterval(t);
  }, [load]);
  if (error && error.status === 401 || error && error.status === 403) return html`<${SignIn} error=${error} />`;
  if (!runs) return html`<p class="muted">${error ? "Cannot list runs: " + error.message : "Loading runs…"}</p>`;
  if (!runs.length) return html`<div class="empty"><h2>No runs yet</h2><p>Start one with <code>laneflow run WORKSPACE FLOW</code> or <code>POST ${BASE}/runs</code>; it shows here at once.</p></div>`;
  const parked = runs.filter((r) => r.status === "awaiting-approval").length;
  const shown = runs.filter((FILTERS.find(([f]) => f === filter) || FILTERS[0])[1]);
  return html`<section class="card">
    <div class="card-head"><h2>Runs</h2><span class="muted">${runs.length} shown${parked ? ` · ${parked} awaiting approval` : ""}${error ? " · " + error.message : ""}</span>
      <span class="grow" /><span class="filters" role="group" aria-label="show">${FILTERS.map(([f]) => html`<button key=${f} class=${"filter" + (f === filter ? " on" : "")} aria-pressed=${f === filter} onClick=${() => choose(f)}>${f}</button>`)}</span></div>
    <table class="runs"><thead><tr><th>status</th><th>run</th><th>flow</th><th class="num">cost</th><th>started</th><th class="num">took</th><th></th></tr></thead>
    <tbody>${shown.map((r) => html`<tr key=${r.id} class="run-row" data-run=${r.id}>
      <td data-k="status"><${Status} s=${r.status} /></td>
      <td data-k="run"><a href=${"#/runs/" + encodeURIComponent(r.id)}>${r.id}</a></td>
      <td data-k="flow">${r.workspace} / <b>${r.flow}</b></td>
      <td data-k="cost" class="num">${m.usd(r.cost_usd)}</td>
      <td data-k="started" title=${r.created_at}>${m.age(r.created_at, now)}</td>
      <td data-k="took" class="num">${m.duration((r.finished_at ? m.at(r.finished_at) : now) - m.at(r.created_at))}</td>
      <td data-k="">${r.status === "awaiting-approval" ? html`<${Actions} run=${r} onDone=${load} />` : r.stop_requested && !m.ENDED.has(r.status) ? html`<span class="muted">stopping</span>` : ""}</td>
    </tr>`)}</tbody></table>${!shown.length && html`<p class="muted">No ${filter} run among the last ${runs.length}.</p>`}</section>`;
}

// A call refused for want of a person the API takes (signin.js signs in again by itself, but
// not round and round: an account without a tenant would be refused each time).
function SignIn({ error }) {
  return html`<section class="card signin" data-k="signin"><h2>Sign in</h2><p>${error.message}.</p>
    ${signin.enabled ? html`<p class="muted">The API refused this account: it may have no tenant (its custom:tenant attribute).</p>
      <div class="actions"><button onClick=${() => signin.signIn()}>Sign in again</button><button onClick=${signin.signOut}>Sign out</button></div>`
    : html`<p class="muted">This API takes signed calls and this viewer signs no one in: people open the viewer at the stack's PeopleUrl.</p>`}</section>`;
}

// -- a run --------------------------------------------------------------------------------------

// The run record, live: server-sent events when the server streams, else polling.
function useRun(id, live) {
  const [run, setRun] = useState(null);
  const [error, setError] = useState(null);
  const refresh = useCallback(async () => {
    try {
      setRun(await api("runs/" + encodeURIComponent(id)));
      setError(null);
    } catch (e) {
      setError(e);
    }
  }, [id]);
  useEffect(() => {
    let poll = null, source = null, closed = false;
    const startPolling = () => {
      live.set("polling");
      refresh();
      poll = setInterval(() => document.hidden || refresh(), POLL_MS);
    };
    if (typeof EventSource === "function" && !authHeader()) {
      let opened = false;
      source = new EventSource(BASE + "/runs/" + encodeURIComponent(id) + "/stream");
      source.addEventListener("open", () => { opened = true; live.set("live"); });
      source.addEventListener("run", (e) => { setRun(JSON.parse(e.data)); setError(null); });
      source.addEventListener("end", () => { source.close(); live.set("ended"); });
      source.addEventListener("error", () => {
        if (closed) return;
        if (!opened || source.readyState === EventSource.CLOSED) { source.close(); source = null; if (!poll) startPolling(); }
        else live.set("reconnecting");
      });
      refresh(); // at once, whatever the stream does
    } else startPolling();
    return () => { closed = true; source && source.close(); poll && clearInterval(poll); };
  }, [id]);
  return { run, error, refresh };
}

function RunPage({ id, live }) {
  const { run, error, refresh } = useRun(id, live);
  const [open, setOpen] = useState(() => new Set());
  const ended = run ? m.ENDED.has(run.status) : false;
  const now = useNow(run && !ended);
  const toggle = (i) => setOpen((o) => { const n = new Set(o); n.has(i) ? n.delete(i) : n.add(i); return n; });
  if (!run) {
    if (error && (error.status === 401 || error.status === 403)) return html`<${SignIn} error=${error} />`;
    return html`<p class=${error ? "err" : "muted"}>${error ? `Cannot show ${id}: ${error.message}` : "Loading " + id + "…"}</p>`;
  }
  const grouped = m.groups(run, now);
  const cost = m.runCost(run), savings = m.runSavings(run);
  const took = (run.finished_at ? m.at(run.finished_at) : now) - m.at(run.created_at);
  return html`<div class="run" data-run=${run.id} data-status=${run.status}>
    <section class="card head">
      <div class="title"><a class="back" href="#/">← runs</a><h2>${run.id}</h2><${Status} s=${run.status} /></div>
      <div class="head-row">
        <dl class="facts">
          <${Fact} k="flow" v=${run.workspace + " / " + run.flow} />
          <${Fact} k="started" v=${m.age(run.created_at, now)} title=${run.created_at} />
          <${Fact} k=${ended ? "took" : "so far"} v=${m.duration(took)} />
          <${Fact} k="drives" v=${run.drives} />
          <${Fact} k="gate" v=${run.options && run.options.gate === false ? "off" : "on"} />
        </dl>
        <div class="cost" data-k="run-cost"><span class="big">${m.usd(cost)}</span><${Sparkline} series=${m.costSeries(run)} />
          <span class="saved" data-k="run-savings" title="what the prompt cache saved: its reads against plain input, less its writes beyond plain input">cache saved <b>${m.usd(savings)}</b></span></div>
        <${Actions} run=${run} onDone=${refresh} />
      </div>
      ${run.error && html`<p class="err run-error">${run.error}</p>`}
      <details class="input"><summary>input</summary><pre>${JSON.stringify(run.input, null, 2)}</pre></details>
      ${error && html`<p class="err">Not up to date: ${error.message}</p>`}
    </section>
    <div class="two">
      <${CacheCard} groups=${grouped} derived=${!Array.isArray(run.lanes)} />
      <${TimeCard} run=${run} now=${now} />
    </div>
    ${grouped.map((g, i) => html`<${Group} key=${g.group + "/" + g.cycle} g=${{ ...g, first: i === 0 }} run=${run} now=${now} open=${open} toggle=${toggle} />`)}
  </div>`;
}

function CacheCard({ groups, derived }) {
  const lanes = groups.flatMap((g) => g.lanes.filter((l) => l.lane !== "approval").map((l) => ({ ...l, group: g.group, cycle: g.cycle })));
  const saved = lanes.map((l) => m.gateSaving(l.figures)).filter(Boolean);
  const avoided = saved.reduce((a, s) => a + s.avoided, 0), tokensSaved = saved.reduce((a, s) => a + s.tokens, 0);
  const gateUsd = lanes.reduce((a, l) => a + (Number(l.figures.gate_savings_usd) || 0), 0);
  return html`<section class="card cache" data-k="cache">
    <div class="card-head"><h2>Prompt cache</h2>${derived && html`<span class="muted" title="this record has no lanes rows: figures are summed from the steps' model calls">from the steps' calls</span>`}</div>
    <p class="headline" data-k="gate-saved">${avoided
      ? html`The warm gate saved <b>${avoided}</b> cold prefix${avoided === 1 ? "" : "es"}: about <b>${m.tokens(tokensSaved)}</b> tokens read from the cache instead of written again${gateUsd ? html`, worth <b>${m.usd(gateUsd)}</b>` : ""}.`
      : lanes.some((l) => l.figures.steps > 1) ? "No cold prefix avoided on this run (nothing was written to the cache, or every step wrote its own)." : "No lane has more than one step: the gate had nothing to share."}</p>
    <div class="scroll"><table class="lanes"><thead><tr><th class="grp">group</th><th>lane</th><th class="num">steps</th><th class="num" title="steps that wrote the lane's prompt prefix to the cache">cold</th><th class="num">cache read</th><th class="num">cache write</th><th class="num" title="summed over the lane's steps">gate wait</th><th class="num" title="what the lane's cache reads saved against plain input, less its writes beyond plain input">saved</th><th class="num" title="what the warm gate saved against every step of the lane writing its own prefix">gate saved</th></tr></thead>
    <tbody>${lanes.map((l) => html`<tr key=${l.group + "/" + l.cycle + "/" + l.lane} data-lane=${l.lane}>
      <td class="grp">${l.group}${l.cycle ? "." + l.cycle : ""}</td><td class="lane-name"><b>${l.lane.split("@")[0]}</b> <span class="muted">${l.lane.split("@").slice(1).join("@")}</span></td><td class="num">${l.figures.steps}</td>
      <td class="num" data-k="cold">${l.figures.cold_prefixes}</td><td class="num" data-k="read">${m.tokens(l.figures.cache_read)}</td>
      <td class="num" data-k="write">${m.tokens(l.figures.cache_write)}</td><td class="num" data-k="wait">${m.duration(l.figures.gate_wait_ms)}</td>
      <td class="num" data-k="savings">${m.usd(l.figures.savings_usd)}</td><td class="num" data-k="gate-savings">${l.figures.gate_savings_usd == null ? "–" : m.usd(l.figures.gate_savings_usd)}</td></tr>`)}</tbody></table></div>
  </section>`;
}

function TimeCard({ run, now }) {
  const { total, parts } = m.timeParts(run, now);
  return html`<section class="card time" data-k="time"><div class="card-head"><h2>Where the time went</h2><span class="muted">${m.duration(total)} in all</span></div>
    <div class="stack" aria-hidden="true">${parts.map((p, i) => html`<span key=${i} class=${p.approval ? "seg approval" : p.what === "queued" ? "seg queued" : "seg group"} style=${{ flexGrow: Math.max(p.ms, 0) || 0.0001 }} title=${p.what + ": " + m.duration(p.ms)} />`)}</div>
    <table class="parts"><tbody>${parts.map((p, i) => html`<tr key=${i}><td class="what">${p.what}</td><td class="num">${m.duration(p.ms)}</td>
      <td class="muted note">${[p.model ? `model ${m.duration(p.model)}` : "", p.gate ? `gate waits ${m.duration(p.gate)}` : ""].filter(Boolean).join(" · ")}</td></tr>`)}</tbody></table>
    <p class="muted small">A group's model and gate times are summed over its steps, which run at once.</p></section>`;
}

function Axis({ g }) {
  const span = g.to - g.from, ticks = [];
  const step = [100, 250, 500, 1000, 2000, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000].find((s) => span / s <= 6) || 3600000;
  for (let t = 0; t <= span; t += step) ticks.push(t);
  return html`<div class="axis">${ticks.map((t) => html`<span key=${t} style=${{ left: (t / span) * 100 + "%" }}>${m.duration(t)}</span>`)}</div>`;
}

function Group({ g, run, now, open, toggle }) {
  const ended = m.ENDED.has(run.status);
  return html`<section class="card group" data-group=${g.group}>
    <div class="card-head"><h2>Group ${g.group}${g.cycle ? ` · cycle ${g.cycle}` : ""}</h2><span class="muted">${m.duration(g.to - g.from)}</span>
      <span class="grow" />${g.first && html`<span class="legend"><span class="key k-gate" /> waiting for its lead <span class="key k-bar" /> running <span class="key k-call" /> model call <span class="key k-ttft" /> first token</span>`}</div>
    ${g.lanes.map((l) => html`<div class="lane" key=${l.lane} data-lane=${l.lane}>
      <div class="lane-head"><b>${l.lane}</b>${l.lane === "approval" && html`<span class="question">${l.steps.map((s) => s.instruction).filter(Boolean).join(" · ")}</span>`}
        ${l.lane !== "approval" && html`<span class="chips"><span class="chip" data-k="cold">${l.figures.cold_prefixes} cold prefix${l.figures.cold_prefixes === 1 ? "" : "es"}</span>
        <span class="chip">cache read ${m.tokens(l.figures.cache_read)}</span><span class="chip">write ${m.tokens(l.figures.cache_write)}</span>
        ${l.figures.gate_wait_ms > 0 && html`<span class="chip gatewait" title="the lane's steps' waits for their lead, summed">gate wait ${m.duration(l.figures.gate_wait_ms)}</span>`}</span>`}</div>
      <div class="rows"><div class="row axis-row"><span class="label"></span><${Axis} g=${g} /><span class="figs muted">took · cache r / w</span></div>
      ${l.steps.map((s) => html`<${StepRow} key=${s.index} s=${s} g=${g} run=${run} now=${now} ended=${ended} open=${open.has(s.index)} toggle=${toggle} />`)}</div>
    </div>`)}
  </section>`;
}

function StepRow({ s, g, run, now, ended, open, toggle }) {
  const x = m.span(s, now, ended, run), pct = (t) => ((t - g.from) / (g.to - g.from)) * 100;
  const phase = m.phase(s, ended), ft = m.firstToken(s), cache = m.cacheOf(s);
  const label = s.agent == null ? "approval" : s.item == null ? s.agent : typeof s.item === "string" ? s.item : JSON.stringify(s.item);
  return html`<div class=${"step" + (open ? " open" : "")} data-step=${s.index} data-phase=${phase}>
    <button class="row" aria-expanded=${open} onClick=${() => toggle(s.index)}>
      <span class="label"><span class="idx">#${s.index}</span> <span class="name">${label}</span> <${Status} s=${phase} label=${phase === "waiting" ? "waiting for lead" : null} />
        ${s.rescue_of != null && html`<span class="muted small-tag">rescue of #${s.rescue_of}</span>`}${s.cycle > 0 && html`<span class="muted small-tag">cycle ${s.cycle}</span>`}
        ${s.cache_break && html`<span class="break" data-k="cache-break" title=${m.cacheBreakText(s.cache_break)}>cache break: ${s.cache_break.layer}</span>`}</span>
      <span class="track">
        ${x.wait && html`<span class="gate" data-k="gate-wait" title=${"waited for its lead " + m.duration(x.wait.to - x.wait.from)} style=${{ left: pct(x.wait.from) + "%", width: Math.max(0.4, pct(x.wait.to) - pct(x.wait.from)) + "%" }} />`}
        ${Number.isFinite(x.start) && html`<span class=${"bar st-" + phase} title=${`${m.duration(x.end - x.start)} · ${m.usd(m.stepCost(s))} · cache read ${cache.read} / write ${cache.write}`} style=${{ left: pct(x.start) + "%", width: Math.max(0.4, pct(x.end) - pct(x.start)) + "%" }}>
          ${(s.calls || []).map((c) => html`<span key=${c.n} class="call" style=${{ left: ((m.at(c.at) - x.start) / Math.max(1, x.end - x.start)) * 100 + "%", width: (c.ms / Math.max(1, x.end - x.start)) * 100 + "%" }} />`)}
        </span>`}
        ${Number.isFinite(ft) && html`<span class="ttft" data-k="first-token" title=${"first token after " + m.duration(s.calls[0].ttft_ms)} style=${{ left: pct(ft) + "%" }} />`}
      </span>
      <span class="figs">${Number.isFinite(x.start) ? m.duration(x.end - x.start) : phase === "waiting" ? "waiting" : ""}${cache.read || cache.write ? html` · <span title="cache read / cache write tokens">${m.tokens(cache.read)} / ${m.tokens(cache.write)}</span>` : ""}</span>
    </button>
    ${open && html`<${StepDetail} s=${s} run=${run} now=${now} />`}
  </div>`;
}

function Pre({ title, text, cls }) {
  if (text == null || text === "") return null;
  return html`<div class="block"><h4>${title}</h4><pre class=${cls || ""}>${typeof text === "string" ? text : JSON.stringify(text, null, 2)}</pre></div>`;
}

function StepDetail({ s, run, now }) {
  const cache = m.cacheOf(s), wait = m.gateWait(s, now, m.at(run.finished_at)), start = m.at(s.started_at);
  const t0 = Number.isFinite(start) ? start : m.at(run.created_at);
  const rel = (iso) => { const d = m.at(iso) - t0; return (d >= 0 ? "+" : "−") + m.duration(Math.abs(d)); };
  const prev = m.previousOf(run, s), diff = m.layerDiff(s, prev);
  const changed = diff.filter((l) => l.change === "changed" || l.change === "new" || l.change === "gone");
  const breaking = changed.filter((l) => !l.dynamic);
  const [allLayers, setAllLayers] = useState(false);
  return html`<div class="detail" data-detail=${s.index}>
    <dl class="facts">
      <${Fact} k="status" v=${s.status + (s.skip_reason ? " — " + s.skip_reason : "")} />
      <${Fact} k="agent · model" v=${(s.agent || "approval") + " · " + s.model} />
      <${Fact} k="attempts" v=${s.attempts} />
      <${Fact} k="cost" v=${m.usd(m.stepCost(s))} />
      <${Fact} k="cache saved" v=${m.usd(s.savings_usd)} />
      <${Fact} k="cache read / write" v=${`${cache.read} / ${cache.write}`} />
      <${Fact} k="tokens in / out" v=${`${cache.input} / ${cache.output}`} />
      <${Fact} k="gate wait" v=${wait ? m.duration(wait.to - wait.from) : "none"} />
      <${Fact} k="first token" v=${s.calls && s.calls[0] && s.calls[0].ttft_ms != null ? m.duration(s.calls[0].ttft_ms) : "–"} />
      <${Fact} k="ran" v=${s.started_at ? m.duration((s.finished_at ? m.at(s.finished_at) : now) - start) : "not started"} />
      <${Fact} k="cache break" v=${s.cache_break ? m.cacheBreakText(s.cache_break) : s.cache_break === null ? "none" : "–"} />
    </dl>
    ${s.error && html`<${Pre} title="error" text=${s.error} cls="err" />`}
    <${Pre} title="message it was sent" text=${s.message} />
    <${Pre} title="result" text=${s.result} />
    ${s.data != null && html`<${Pre} title="data" text=${s.data} />`}
    ${(s.prompt_layers || []).length > 0 && html`<div class="block layers" data-k="layers"><h4>prompt layers
        <span class="muted">${!prev ? " · the agent's first step" : !changed.length ? ` · all the same as #${prev.index}` : ` · changed since #${prev.index}: ${changed.map((l) => l.name).join(", ")}`}</span></h4>
      ${prev && breaking.length > 0 && html`<p class="breaking" data-k="breaking">Stable layer${breaking.length === 1 ? "" : "s"} <b>${breaking.map((l) => l.name).join(", ")}</b> changed since #${prev.index}: this step could not read that step's cached prefix.</p>`}
      ${prev && changed.length > 0 && !breaking.length && html`<p class="muted small">Only dynamic layers changed: they sit after the cache breakpoint, so the cached prefix still matched.</p>`}
      <table class="layer-table"><tbody>${(allLayers ? diff : diff.filter((l) => l.change !== "same")).map((l) => html`<tr key=${l.name} class=${"ch-" + l.change}>
        <td>${l.name}${l.dynamic ? html` <span class="muted">dynamic</span>` : ""}</td><td class="num">${l.chars} ch</td>
        <td><code>${l.sha256}</code>${l.change === "changed" ? html` <span class="muted">was <code>${l.before.sha256}</code></span>` : ""}</td><td class="change">${l.change}</td></tr>`)}</tbody></table>
      ${diff.some((l) => l.change === "same") && html`<button class="linkish" onClick=${() => setAllLayers(!allLayers)}>${allLayers ? "only what changed" : `show all ${diff.length} layers`}</button>`}
    </div>`}
    ${(s.calls || []).length > 0 && html`<div class="block"><h4>model calls</h4><div class="scroll"><table class="calls"><thead><tr><th>#</th><th>at</th><th class="num">ms</th><th class="num">first token</th><th class="num">in</th><th class="num">out</th><th class="num">cache read</th><th class="num">cache write</th><th>tools</th><th>stop</th><th class="num">cost</th></tr></thead>
      <tbody>${s.calls.map((c) => html`<tr key=${c.n}><td>${c.n}${c.attempt ? ` (attempt ${c.attempt})` : ""}</td><td>${rel(c.at)}</td><td class="num">${c.ms}</td><td class="num">${c.ttft_ms ?? "–"}</td>
        <td class="num">${c.tokens.input}</td><td class="num">${c.tokens.output}</td><td class="num">${c.tokens.cache_read}</td><td class="num">${c.tokens.cache_write}</td><td>${c.tools}</td><td>${c.stop || ""}</td><td class="num">${m.usd(c.cost_usd)}</td></tr>`)}</tbody></table></div></div>`}
    ${(s.events || []).length > 0 && html`<div class="block"><h4>events</h4><ul class="events">${s.events.map((e, i) => html`<li key=${i} class=${"ev-" + e.type}><span class="when">${rel(e.t)}</span><span class="type">${e.type}</span><span class="text">${e.text}</span></li>`)}</ul></div>`}
    <div class="answer-slot" data-slot="answer">${s.status === "running" && html`<${AnswerBox} s=${s} run=${run} />`}</div>
  </div>`;
}

// A question the step waits on (its ask tool), answered here (POST .../steps/{index}/answer).
function AnswerBox({ s, run }) {
  const [question, setQuestion] = useState(null);
  const [text, setText] = useState("");
  const [said, setSaid] = useState("");
  const asked = (s.events || []).filter((e) => e.type === "ask").length;
  useEffect(() => {
    let gone = false;
    api(`questions?run=${encodeURIComponent(run.id)}`)
      .then((b) => { if (!gone) setQuestion((b.questions || []).find((q) => q.index === s.index) || null); })
      .catch(() => {});
    return () => { gone = true; };
  }, [run.id, s.index, asked]);
  if (!question) return null;
  const send = async (e) => {
    e.preventDefault();
    try {
      await api(`runs/${encodeURIComponent(run.id)}/steps/${s.index}/answer`, { method: "POST", body: { text } });
      setSaid("answered: the step goes on with it"); setQuestion(null); setText("");
    } catch (err) { setSaid(err.message); }
  };
  return html`<form class="block answer" data-k="answer" onSubmit=${send}><h4>a question for you</h4>
    <p data-k="question">${question.question}</p>
    <textarea aria-label="your answer" value=${text} onInput=${(e) => setText(e.target.value)} rows="3"></textarea>
    <button type="submit" disabled=${!text.trim()}>Answer</button>${said && html` <span class="muted">${said}</span>`}</form>`;
}

// -- the page -----------------------------------------------------------------------------------

function App() {
  const route = useRoute();
  const [state, setState] = useState("live");
  const live = useMemo(() => ({ set: setState }), []);
  const [offline, setOffline] = useState(!navigator.onLine);
  useEffect(() => {
    const on = () => setOffline(!navigator.onLine);
    addEventListener("online", on); addEventListener("offline", on);
    return () => { removeEventListener("online", on); removeEventListener("offline", on); };
  }, []);
  useEffect(() => { document.title = route.page === "run" ? `${route.id} · laneflow` : "laneflow runs"; }, [route]);
  return html`<header class="top"><a class="brand" href="#/">laneflow</a><span class="muted where">${route.page === "run" ? "run" : "runs"}</span>
      <span class="grow" /><span class=${"live " + (offline ? "offline" : state)} data-k="live">${offline ? "offline" : state}</span></header>
    <main>${route.page === "run" ? html`<${RunPage} key=${route.id} id=${route.id} live=${live} />` : html`<${RunList} live=${live} />`}</main>`;
}

const root = document.getElementById("app");
root.textContent = "";
render(html`<${App} />`, root);
