// A run's page at `#/runs/ID`: its head (status, cost as it grew, what a person can do),
// the prompt cache and where the time went, and each group as a timeline of its lanes.
// It follows the run live (`useRun`) and keeps what the person opened open.
import { useEffect, useRef, useState } from "preact/hooks";
import { useRun } from "./api.js";
import { Actions } from "./actions.js";
import * as m from "./model.js";
import { StepRow } from "./step.js";
import { Fact, PageTitle, SignIn, Status, announce, html, useNow } from "./ui.js";

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

// Says a run's shown status when it changes (not when the page opens on it).
export function useStatusAnnounced(run) {
  const last = useRef(null);
  const shown = run ? m.shownStatus(run) : null;
  useEffect(() => {
    if (last.current && shown && last.current !== shown) announce(`run ${run.id} is now ${shown}`);
    last.current = shown;
  }, [shown]);
}

// What a page of a run says before its record has come (or when it cannot come).
export function Waiting({ id, error }) {
  if (error && (error.status === 401 || error.status === 403)) return html`<${SignIn} error=${error} />`;
  return html`<section class="card"><${PageTitle} cls="run-id">${id}<//><p class=${error ? "err" : "muted"}>${error ? `Cannot show this run: ${error.message}` : "Loading…"}</p></section>`;
}

export function RunPage({ id, live }) {
  const { run, error, refresh } = useRun(id, live);
  const [open, setOpen] = useState(() => new Set());
  const ended = run ? m.ENDED.has(run.status) : false;
  const now = useNow(run && !ended);
  useStatusAnnounced(run);
  const toggle = (i) => setOpen((o) => { const n = new Set(o); n.has(i) ? n.delete(i) : n.add(i); return n; });
  if (!run) return html`<${Waiting} id=${id} error=${error} />`;
  const grouped = m.groups(run, now);
  const cost = m.runCost(run), savings = m.runSavings(run);
  const took = (run.finished_at ? m.at(run.finished_at) : now) - m.at(run.created_at);
  const events = m.historyOf(run).length;
  return html`<div class="run" data-run=${run.id} data-status=${run.status} data-shown=${m.shownStatus(run)}>
    <section class="card head">
      <div class="title"><a class="back" href="#/">← runs</a><${PageTitle} cls="run-id">${run.id}<//><${Status} s=${m.shownStatus(run)} />
        <span class="grow" /><a class="history-link" data-k="history-link" href=${`#/runs/${encodeURIComponent(run.id)}/history`}>Event history <span class="muted">(${events})</span></a></div>
      <div class="head-row">
        <dl class="facts">
          <${Fact} k="flow" v=${run.workspace + " / " + run.flow} />
          ${run.schedule_id && html`<${Fact} k="schedule" title=${"its firing at " + run.scheduled_at} v=${html`<a data-k="schedule-link" href=${"#/schedules/" + encodeURIComponent(run.schedule_id)}>${run.schedule_id}</a>`} />`}
          <${Fact} k="started" v=${m.age(run.created_at, now)} title=${run.created_at} />
          <${Fact} k=${ended ? "took" : "so far"} v=${m.duration(took)} />
          <${Fact} k="drives" v=${run.drives} />
          <${Fact} k="gate" v=${run.options && run.options.gate === false ? "off" : "on"} />
        </dl>
        <div class="cost" data-k="run-cost"><span class="big">${m.usd(cost)}</span><${Sparkline} series=${m.costSeries(run)} />
          <span class="saved" data-k="run-savings" title="what the prompt cache saved: its reads against plain input, less its writes beyond plain input">cache saved <b>${m.usd(savings)}</b></span></div>
        <${Actions} run=${run} onDone=${refresh} />
      </div>
      ${run.error && html`<p class=${m.shownStatus(run) === "stopped" ? "run-error quiet" : "err run-error"} data-k="run-error">${run.error}</p>`}
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

