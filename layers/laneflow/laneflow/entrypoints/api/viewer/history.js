// A run's raw event history at `#/runs/ID/history`: every event of every step, newest last,
// with its data as recorded; filtered by step (and to tool calls with captures), the filter
// kept in the URL (`?step=N&captures=1`). Live like the run's page.
import { useState } from "preact/hooks";
import { useRun } from "./api.js";
import * as m from "./model.js";
import { Waiting, useStatusAnnounced } from "./run.js";
import { PageTitle, Status, html } from "./ui.js";

export function HistoryPage({ id, live, params, go }) {
  const { run, error } = useRun(id, live);
  useStatusAnnounced(run);
  if (!run) return html`<${Waiting} id=${id} error=${error} />`;
  const step = params.get("step"), captures = params.get("captures") === "1";
  const all = m.historyOf(run);
  const rows = all.filter((e) => (step == null || String(e.step) === step) && (!captures || e.capture));
  const steps = new Map((run.steps || []).map((s) => [s.index, s]));
  const where = (change) => {
    const p = new URLSearchParams(params);
    for (const [k, v] of Object.entries(change)) v == null || v === "" ? p.delete(k) : p.set(k, v);
    const query = p.toString();
    go(`#/runs/${encodeURIComponent(run.id)}/history${query ? "?" + query : ""}`, { replace: true });
  };
  const t0 = m.at(run.created_at);
  return html`<section class="card history" data-run=${run.id} data-status=${run.status}>
    <div class="title"><a class="back" href=${"#/runs/" + encodeURIComponent(run.id)}>← the run</a><${PageTitle}>Event history<//>
      <span class="run-id muted">${run.id}</span><${Status} s=${m.shownStatus(run)} /></div>
    <form class="history-filter" onSubmit=${(e) => e.preventDefault()}>
      <label for="history-step">Step</label>
      <select id="history-step" value=${step == null ? "" : step} onChange=${(e) => where({ step: e.target.value })}>
        <option value="">every step</option>
        ${(run.steps || []).map((s) => html`<option key=${s.index} value=${String(s.index)}>#${s.index} ${m.stepLabel(s)} (${(s.events || []).length})</option>`)}
      </select>
      <label class="check"><input type="checkbox" checked=${captures} onChange=${(e) => where({ captures: e.target.checked ? "1" : "" })} /> only tool calls with a capture</label>
      <span class="muted" data-k="history-count">${rows.length} of ${all.length} events</span>
    </form>
    ${rows.length ? html`<div class="scroll"><table class="events-table" data-k="history">
      <thead><tr><th>at</th><th class="num">since start</th><th>step</th><th class="num">attempt</th><th>type</th><th>what</th><th>data</th></tr></thead>
      <tbody>${rows.map((e) => html`<tr key=${e.step + "/" + e.n} class=${"ev-" + e.type} data-step=${e.step}>
        <td class="when"><time datetime=${e.t}>${(e.t || "").replace("T", " ").replace("Z", "")}</time></td>
        <td class="num since">${m.duration(e.at - t0)}</td>
        <td class="step"><a href=${"#/runs/" + encodeURIComponent(run.id) + "/history?step=" + e.step} onClick=${(ev) => { ev.preventDefault(); where({ step: String(e.step) }); }}>#${e.step}</a> <span class="muted">${steps.has(e.step) ? m.stepLabel(steps.get(e.step)) : ""}</span></td>
        <td class="num attempt">${e.attempt ?? ""}</td>
        <td class="type">${e.type}</td>
        <td class="text">${e.text}</td>
        <td class="data">${e.capture && html`<div class="capture" data-k="capture">capture <code>${e.capture}</code></div>`}${e.data && html`<${Data} data=${e.data} />`}</td>
      </tr>`)}</tbody></table></div>`
    : html`<p class="muted" data-k="no-events">${all.length ? "No event of this step matches." : "No event yet."}</p>`}
  </section>`;
}

function Data({ data }) {
  const [open, setOpen] = useState(false);
  const keys = Object.keys(data).filter((k) => k !== "capture");
  if (!keys.length) return null;
  return html`<button type="button" class="linkish" aria-expanded=${open} onClick=${() => setOpen(!open)}>${open ? "hide data" : `data (${keys.join(", ")})`}</button>
    ${open && html`<pre>${JSON.stringify(data, null, 2)}</pre>`}`;
}
