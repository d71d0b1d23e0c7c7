// What the viewer shows, derived from a run record (the API's `GET /runs/{id}`): pure
// functions, no DOM. Fields another version may not have yet (run `lanes`, step
// `cache_break`) are used when present; without them the figures are derived from the
// steps' spans and gate events, and marked as derived.

export const ENDED = new Set(["completed", "failed"]);

// -- what a person can do to a run, and what it shows as ---------------------------------------

// A run a person stopped shows as "stopped", not "failed": it ended failed with `stop_requested`
// (a run whose stop came after it had completed stays "completed").
export const shownStatus = (run) => (run.stop_requested && run.status === "failed" ? "stopped" : run.status);

// Queued, running and parked runs can be stopped; once asked, a running one is "stopping".
export const canStop = (run) => !ENDED.has(run.status) && !run.stop_requested;
export const stopping = (run) => !ENDED.has(run.status) && !!run.stop_requested;

// A run that failed, not one that was stopped, can be redriven from where it failed.
export const canRedrive = (run) => run.status === "failed" && !run.stop_requested;

// -- the list's state, kept in the URL: #/?status=failed&q=words&before=ID&before=ID ----------

// Each filter and the statuses it asks the API for (`stopped`: a failed run a person stopped).
export const FILTERS = [["all", ""], ["active", "queued,running,awaiting-approval"], ["awaiting-approval", "awaiting-approval"],
  ["failed", "failed"], ["stopped", "stopped"], ["completed", "completed"]];

// `before` is repeated: the cursor of each page from the first, so "newer" is one step back
// and a reload lands on the same page.
export function readListState(search) {
  const p = new URLSearchParams(search || "");
  const filter = FILTERS.some(([f]) => f === p.get("status")) ? p.get("status") : "all";
  return { filter, q: p.get("q") || "", trail: p.getAll("before").filter(Boolean) };
}

export function listHash({ filter, q, trail }) {
  const p = new URLSearchParams();
  if (filter && filter !== "all") p.set("status", filter);
  if (q && q.trim()) p.set("q", q.trim());
  for (const cursor of trail || []) p.append("before", cursor);
  const query = p.toString();
  return "#/" + (query ? "?" + query : "");
}

export function listRequest({ filter, q, trail }, limit) {
  const p = new URLSearchParams({ limit: String(limit) });
  const statuses = (FILTERS.find(([f]) => f === filter) || FILTERS[0])[1];
  if (statuses) p.set("status", statuses);
  if (q && q.trim()) p.set("q", q.trim());
  if (trail && trail.length) p.set("before", trail[trail.length - 1]);
  return "runs?" + p.toString();
}

// -- a run's raw history ------------------------------------------------------------------------

export const stepLabel = (s) => (s.agent == null ? "approval" : s.item == null ? s.agent : `${s.agent} · ${typeof s.item === "string" ? s.item : JSON.stringify(s.item)}`);

// The reference of a tool call's capture (its input and output, kept by the capture sink), or null.
export const captureOf = (e) => (e && e.data && typeof e.data.capture === "string" ? e.data.capture : null);

export const capturesOf = (s) => (s.events || []).filter(captureOf);

// Every event of every step, oldest first (newest last); a step's own order breaks a tie.
export function historyOf(run) {
  const rows = [];
  for (const s of run.steps || []) (s.events || []).forEach((e, n) => rows.push({ ...e, step: s.index, n, at: at(e.t), capture: captureOf(e) }));
  return rows.sort((a, b) => (a.at - b.at) || (a.step - b.step) || (a.n - b.n));
}

export const at = (iso) => (iso ? Date.parse(iso) : NaN);

const sum = (xs) => xs.reduce((a, b) => a + (Number(b) || 0), 0);

export function usd(x) {
  const v = Number(x) || 0;
  if (v === 0) return "$0";
  const a = Math.abs(v); // a saving can be below zero: a step that only wrote the cache
  return (v < 0 ? "−$" : "$") + a.toFixed(a < 0.01 ? 4 : a < 10 ? 3 : 2);
}

export function tokens(n) {
  const v = Number(n) || 0;
  return v >= 10000 ? (v / 1000).toFixed(v >= 100000 ? 0 : 1) + "k" : String(v);
}

export function duration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "–";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  const m = Math.floor(ms / 60000), s = Math.round((ms % 60000) / 1000);
  return m < 60 ? `${m} min ${s} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function age(iso, now) {
  const ms = now - at(iso);
  if (!Number.isFinite(ms)) return "";
  if (ms < 60000) return Math.max(0, Math.round(ms / 1000)) + " s ago";
  if (ms < 3600000) return Math.round(ms / 60000) + " min ago";
  if (ms < 86400000) return Math.round(ms / 3600000) + " h ago";
  return Math.round(ms / 86400000) + " d ago";
}

// A step's cost so far: its recorded cost, or its spans' while it runs.
export const stepCost = (s) => Math.max(Number(s.cost_usd) || 0, sum((s.calls || []).map((c) => c.cost_usd)));

// The run's cost so far: the record's, or its steps' while a group is still running.
export const runCost = (run) => Math.max(Number(run.cost_usd) || 0, sum((run.steps || []).map(stepCost)));

// What the prompt cache saved the run: its steps' savings (the record's while they are not read).
export const runSavings = (run) => (run.steps && run.steps.length ? sum(run.steps.map((s) => s.savings_usd)) : Number(run.savings_usd) || 0);

// The run's cost as it grew: [time, cost so far] at the end of every model call.
export function costSeries(run) {
  const points = [];
  for (const s of run.steps || []) for (const c of s.calls || []) points.push([at(c.at) + (c.ms || 0), Number(c.cost_usd) || 0]);
  points.sort((a, b) => a[0] - b[0]);
  let total = 0;
  const series = [[at(run.driven_at || run.created_at), 0]];
  for (const [t, c] of points) series.push([t, (total += c)]);
  return series;
}

export const laneOf = (s) => (s.agent == null ? "approval" : `${s.agent}@${s.model}`);

export function cacheOf(s) {
  const calls = s.calls || [];
  return { read: sum(calls.map((c) => c.tokens && c.tokens.cache_read)), write: sum(calls.map((c) => c.tokens && c.tokens.cache_write)),
    input: sum(calls.map((c) => c.tokens && c.tokens.input)), output: sum(calls.map((c) => c.tokens && c.tokens.output)) };
}

// A sibling waiting for its lead: for its reply, or (the reserve) for its end. Not the lead's "released N waiting sibling(s)".
const isWaiting = (e) => e.type === "gate" && /^prompt cache: waiting/.test(e.text || "");

// The step's wait at the warm gate: from its "waiting" line to its start (or now, while it waits).
export function gateWait(s, now, runEnd = NaN) {
  const line = (s.events || []).find(isWaiting);
  if (!line) return null;
  const from = at(line.t);
  // A sibling skipped while it waited (the run was stopped) waited until it was skipped.
  const to = s.started_at ? at(s.started_at) : s.status === "pending" ? now : s.finished_at ? at(s.finished_at) : runEnd;
  return Number.isFinite(to) && to >= from ? { from, to } : null;
}

// What the step is doing, in a person's words: a sibling that waits for its lead is "waiting".
export function phase(s, runEnded) {
  if (s.status === "pending" && !runEnded && (s.events || []).some(isWaiting)) return "waiting";
  return s.status;
}

export function firstToken(s) {
  const c = (s.calls || [])[0];
  return c && c.ttft_ms != null ? at(c.at) + c.ttft_ms : NaN;
}

// When an approval began to wait for a person: the run's park, else the end of the steps before it.
function approvalStart(run, s) {
  if (s.status === "awaiting-approval" && run.parked_at) return at(run.parked_at);
  const before = (run.steps || []).filter((x) => x.index < s.index && x.finished_at).map((x) => at(x.finished_at));
  return before.length ? Math.max(...before) : NaN;
}

// A step's interval on the timeline: from its gate wait (or start) to its end (or now).
export function span(s, now, runEnded, run) {
  const wait = gateWait(s, now, run ? at(run.finished_at) : NaN);
  const start = s.started_at ? at(s.started_at) : s.agent == null && run ? approvalStart(run, s) : NaN;
  const end = s.finished_at ? at(s.finished_at) : (Number.isFinite(start) && !runEnded ? now : start);
  const from = wait ? wait.from : start;
  return { from, start, end: Number.isFinite(end) ? end : (wait ? wait.to : NaN), wait };
}

// Groups (and cycles) in order, each with its lanes in order of their first step.
export function groups(run, now) {
  const ended = ENDED.has(run.status);
  const rows = Array.isArray(run.lanes) ? run.lanes : null;
  const byGroup = new Map();
  for (const s of run.steps || []) {
    const key = `${s.group}/${s.cycle || 0}`;
    if (!byGroup.has(key)) byGroup.set(key, { group: s.group, cycle: s.cycle || 0, lanes: new Map() });
    const g = byGroup.get(key), lane = laneOf(s);
    if (!g.lanes.has(lane)) g.lanes.set(lane, []);
    g.lanes.get(lane).push(s);
  }
  return [...byGroup.values()].sort((a, b) => a.group - b.group || a.cycle - b.cycle).map((g) => {
    const lanes = [...g.lanes.entries()].map(([lane, steps]) => {
      const row = rows && rows.find((r) => r.group === g.group && (r.cycle || 0) === g.cycle && r.lane === lane);
      return { lane, steps, figures: row ? { ...row, derived: false } : deriveFigures(steps, now, at(run.finished_at)) };
    });
    const spans = (run.steps || []).filter((s) => s.group === g.group && (s.cycle || 0) === g.cycle).map((s) => span(s, now, ended, run));
    const from = Math.min(...spans.map((x) => x.from).filter(Number.isFinite));
    const to = Math.max(...spans.map((x) => x.end).filter(Number.isFinite));
    return { ...g, lanes, from, to: Number.isFinite(to) && to > from ? to : from + 1 };
  });
}

// A lane's figures from its steps: a cold prefix is a step whose first call wrote the cache.
export function deriveFigures(steps, now, runEnd = NaN) {
  const agentSteps = steps.filter((s) => s.agent != null);
  const cache = agentSteps.map(cacheOf);
  const waits = agentSteps.map((s) => gateWait(s, now, runEnd)).filter(Boolean);
  return {
    steps: steps.length,
    cold_prefixes: agentSteps.filter((s) => { const c = (s.calls || [])[0]; return c && c.tokens && c.tokens.cache_write > 0; }).length,
    cache_read: sum(cache.map((c) => c.read)), cache_write: sum(cache.map((c) => c.write)),
    gate_wait_ms: Math.round(sum(waits.map((w) => w.to - w.from))),
    // The steps' savings; the gate's needs the price catalog, so only the record's rows have it.
    savings_usd: sum(agentSteps.map((s) => s.savings_usd)), gate_savings_usd: null, derived: true,
  };
}

// What the gate saved on a lane: each step beyond its cold prefixes read the prefix instead
// of writing it again (the prefix's size is what one cold step wrote).
export function gateSaving(f) {
  if (!f || !f.cold_prefixes || !f.cache_write || f.steps < 2) return null;
  const prefix = f.cache_write / f.cold_prefixes;
  const avoided = Math.max(0, f.steps - f.cold_prefixes);
  return { avoided, tokens: Math.round(avoided * prefix), prefix: Math.round(prefix) };
}

// The agent's previous step with prompt layers (the one a cache would have been written by).
export function previousOf(run, step) {
  let best = null;
  for (const s of run.steps || []) {
    if (s.index < step.index && s.agent === step.agent && s.agent != null && (s.prompt_layers || []).length) {
      if (!best || s.index > best.index) best = s;
    }
  }
  return best;
}

// Each layer against the previous step's: "same", "changed" (its sha256 differs), "new", "gone".
export function layerDiff(step, prev) {
  const before = new Map(((prev && prev.prompt_layers) || []).map((l) => [l.name, l]));
  const rows = (step.prompt_layers || []).map((l) => {
    const old = before.get(l.name);
    before.delete(l.name);
    return { ...l, change: !prev ? "first" : !old ? "new" : old.sha256 === l.sha256 ? "same" : "changed", before: old || null };
  });
  for (const old of before.values()) rows.push({ ...old, change: "gone", before: old });
  return rows;
}

export function cacheBreakText(b) {
  if (!b) return "";
  const what = { tools: "its tools changed", model: "its model changed", expired: "the cached prefix had expired",
    "below-minimum": "its prefix is below the model's minimum cacheable size" }[b.layer];
  return (what || `layer ${b.layer} changed`) + (b.since ? ` (since ${b.since})` : "");
}

// Where the run's time went: queued, each group's span, waits for a person.
export function timeParts(run, now) {
  const parts = [];
  const created = at(run.created_at), driven = at(run.driven_at);
  const end = run.finished_at ? at(run.finished_at) : now;
  if (Number.isFinite(driven)) parts.push({ what: "queued", ms: driven - created });
  for (const g of groups(run, now)) {
    const approval = g.lanes.length === 1 && g.lanes[0].lane === "approval";
    const waits = sum(g.lanes.map((l) => l.figures.gate_wait_ms || 0));
    const model = sum(g.lanes.flatMap((l) => l.steps).flatMap((s) => s.calls || []).map((c) => c.ms));
    parts.push({ what: approval ? `group ${g.group}: waiting for a person` : `group ${g.group}${g.cycle ? ` (cycle ${g.cycle})` : ""}: ${g.lanes.map((l) => l.lane.split("@")[0]).join(", ")}`,
      ms: g.to - g.from, gate: waits, model, approval });
  }
  return { total: end - created, parts };
}
