// The list of runs at `#/`: a page at a time (newest first), filtered by status and
// searched, with all of it kept in the URL (`model.readListState`), so a reload or a shared
// link opens the same page. It polls; a listed run whose status changes is announced.
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { BASE, POLL_MS, api } from "./api.js";
import { Actions } from "./actions.js";
import * as m from "./model.js";
import { PageTitle, SignIn, Status, announce, html, useNow } from "./ui.js";

export const PAGE = 25;

export function RunList({ live, state, go }) {
  const [page, setPage] = useState(null);
  const [error, setError] = useState(null);
  const request = m.listRequest(state, PAGE);
  const asked = useRef(request);
  const seen = useRef(new Map());
  const now = useNow(true);
  const load = useCallback(async () => {
    try {
      const got = await api(request);
      if (asked.current !== request) return; // an answer to a page the person has left
      for (const r of got.runs) {
        const was = seen.current.get(r.id), is = m.shownStatus(r);
        if (was && was !== is) announce(`run ${r.id} is now ${is}`);
        seen.current.set(r.id, is);
      }
      setPage(got);
      setError(null);
      live.set(navigator.onLine ? "live" : "offline");
    } catch (e) {
      if (asked.current !== request) return;
      setError(e);
      live.set(e.offline ? "offline" : "error");
    }
  }, [request]);
  useEffect(() => {
    asked.current = request;
    seen.current = new Map();
    load();
    const t = setInterval(() => document.hidden || load(), POLL_MS);
    return () => clearInterval(t);
  }, [load]);
  if (error && (error.status === 401 || error.status === 403)) return html`<${SignIn} error=${error} />`;
  const to = (change, replace) => go(m.listHash({ ...state, ...change }), { replace });
  const filtered = state.filter !== "all" || !!state.q;
  const runs = page ? page.runs : [];
  return html`<section class="card list">
    <div class="card-head"><${PageTitle}>Runs<//>
      <span class="muted" data-k="count">${!page ? (error ? "Cannot list runs: " + error.message : "Loading runs…") : summary(page, state)}${page && error ? " · " + error.message : ""}</span>
      <span class="grow" />
      <${Search} q=${state.q} onSearch=${(q, replace) => to({ q, trail: [] }, replace)} />
    </div>
    <div class="filters" role="group" aria-label="show only">${m.FILTERS.map(([f]) => html`<button type="button" key=${f} class=${"filter" + (f === state.filter ? " on" : "")} aria-pressed=${f === state.filter} onClick=${() => to({ filter: f, trail: [] })}>${f}</button>`)}</div>
    ${page && !runs.length && !filtered && !state.trail.length
      ? html`<div class="empty"><h2>No runs yet</h2><p>Start one with <code>laneflow run WORKSPACE FLOW</code> or <code>POST ${BASE}/runs</code>; it shows here at once.</p></div>`
      : page && !runs.length ? html`<p class="muted none" data-k="none">No run here${filtered ? " matches" : ""}${page.next ? ` among the ${page.searched} runs read: look further with Older` : ""}.</p>`
      : runs.length > 0 && html`<${Table} runs=${runs} now=${now} onDone=${load} />`}
    ${page && html`<${Pager} state=${state} page=${page} to=${to} />`}
  </section>`;
}

function summary(page, state) {
  const parked = page.runs.filter((r) => r.status === "awaiting-approval").length;
  const where = state.trail.length ? `page ${state.trail.length + 1}` : "newest";
  const read = state.q || state.filter !== "all" ? ` · ${page.searched} read` : "";
  return `${page.runs.length} shown (${where})${read}${parked ? ` · ${parked} awaiting approval` : ""}`;
}

// The search box: the URL follows what is typed (replacing, not adding to, the history).
function Search({ q, onSearch }) {
  const [text, setText] = useState(q);
  const timer = useRef(null);
  // From the URL (Back, a reload), unless it is what is being typed (the URL keeps it trimmed).
  useEffect(() => { if (q !== text.trim()) setText(q); }, [q]);
  useEffect(() => () => clearTimeout(timer.current), []);
  const typed = (value) => {
    setText(value);
    clearTimeout(timer.current);
    timer.current = setTimeout(() => onSearch(value, true), 350);
  };
  return html`<form class="search" role="search" onSubmit=${(e) => { e.preventDefault(); clearTimeout(timer.current); onSearch(text, false); }}>
    <label for="run-search">Search</label>
    <input id="run-search" type="search" placeholder="run id, flow, status, error" value=${text} onInput=${(e) => typed(e.target.value)} />
  </form>`;
}

function Pager({ state, page, to }) {
  const n = state.trail.length;
  if (!n && !page.next) return null;
  return html`<nav class="pager" aria-label="pages of runs">
    <button type="button" disabled=${!n} onClick=${() => to({ trail: [] })}>Newest</button>
    <button type="button" disabled=${!n} onClick=${() => to({ trail: state.trail.slice(0, -1) })}>← Newer</button>
    <span class="muted" data-k="page">page ${n + 1}</span>
    <button type="button" disabled=${!page.next} onClick=${() => to({ trail: [...state.trail, page.next] })}>Older →</button>
  </nav>`;
}

function Table({ runs, now, onDone }) {
  return html`<table class="runs"><thead><tr><th>status</th><th>run</th><th>flow</th><th class="num">cost</th><th>started</th><th class="num">took</th><th><span class="sr-only">actions</span></th></tr></thead>
    <tbody>${runs.map((r) => html`<tr key=${r.id} class="run-row" data-run=${r.id} data-shown=${m.shownStatus(r)}>
      <td data-k="status"><${Status} s=${m.shownStatus(r)} /></td>
      <td data-k="run"><a href=${"#/runs/" + encodeURIComponent(r.id)}>${r.id}</a></td>
      <td data-k="flow">${r.workspace} / <b>${r.flow}</b>${r.error && html`<div class=${m.shownStatus(r) === "stopped" ? "row-error quiet" : "row-error"} title=${r.error}>${r.error}</div>`}</td>
      <td data-k="cost" class="num">${m.usd(r.cost_usd)}</td>
      <td data-k="started" title=${r.created_at}>${m.age(r.created_at, now)}</td>
      <td data-k="took" class="num">${m.duration((r.finished_at ? m.at(r.finished_at) : now) - m.at(r.created_at))}</td>
      <td data-k="actions"><${Actions} run=${r} onDone=${onDone} inRow=${true} /></td>
    </tr>`)}</tbody></table>`;
}
