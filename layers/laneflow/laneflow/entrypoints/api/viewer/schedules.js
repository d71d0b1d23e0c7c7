// Schedules: the list at `#/schedules` (each with its next firing times, on its zone's clock,
// and what its last firing did) and a schedule's page at `#/schedules/ID` (its next
// firings, its latest firings - started, skipped, buffered, missed, failed, with why - and
// the runs it started, each a link to the run's page). Both poll.
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { BASE, POLL_MS, api } from "./api.js";
import * as m from "./model.js";
import { Fact, PageTitle, SignIn, Status, html, useNow } from "./ui.js";

// What to show of a firing time: its wall clock in the schedule's zone, as the API gives it
// (`2026-03-30T07:00:00+02:00` -> `Mon 30 Mar 07:00 (+02:00)`), and how far off it is.
const DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

export function wallClock(iso) {
  const hit = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::\d{2})?([+-]\d{2}:\d{2}|Z)$/.exec(iso || "");
  if (!hit) return iso || "";
  const [, y, mo, d, hh, mm, off] = hit;
  const day = DAYS[new Date(Date.UTC(+y, +mo - 1, +d)).getUTCDay()];
  return `${day} ${+d} ${MONTHS[+mo - 1]} ${hh}:${mm}${off === "Z" || off === "+00:00" ? "" : ` (${off})`}`;
}

function inTime(iso, now) {
  const ms = m.at(iso) - now;
  return ms >= 0 ? "in " + m.duration(ms) : m.duration(-ms) + " ago";
}

function usePolled(path, live) {
  const [got, setGot] = useState(null);
  const [error, setError] = useState(null);
  const asked = useRef(path);
  const load = useCallback(async () => {
    try {
      const answer = await api(path);
      if (asked.current !== path) return;
      setGot(answer);
      setError(null);
      live.set(navigator.onLine ? "live" : "offline");
    } catch (e) {
      if (asked.current !== path) return;
      setError(e);
      live.set(e.offline ? "offline" : "error");
    }
  }, [path]);
  useEffect(() => {
    asked.current = path;
    load();
    const t = setInterval(() => document.hidden || load(), POLL_MS);
    return () => clearInterval(t);
  }, [load]);
  return { got, error, load };
}

const STATE_PILL = { enabled: "running", paused: "skipped" };
const OUTCOME_PILL = { started: "completed", skipped: "skipped", buffered: "waiting", missed: "stopped", failed: "failed" };

export function ScheduleList({ live }) {
  const { got, error } = usePolled("schedules", live);
  const now = useNow(true);
  if (error && (error.status === 401 || error.status === 403)) return html`<${SignIn} error=${error} />`;
  const schedules = got ? got.schedules : [];
  return html`<section class="card list schedules">
    <div class="card-head"><${PageTitle}>Schedules<//>
      <span class="muted" data-k="count">${!got ? (error ? "Cannot list schedules: " + error.message : "Loading schedules…") : `${schedules.length} schedule${schedules.length === 1 ? "" : "s"}`}</span>
      <span class="grow" /><a href="#/">runs →</a></div>
    ${got && !schedules.length
      ? html`<div class="empty"><h2>No schedules yet</h2><p>Add one with <code>laneflow schedule add WORKSPACE FLOW "cron(0 7 ? * MON-FRI *)"</code> or <code>POST ${BASE}/schedules</code>.</p></div>`
      : schedules.length > 0 && html`<table class="runs schedule-table"><thead><tr><th>state</th><th>schedule</th><th>flow</th><th>when</th><th>next firings</th><th>last firing</th></tr></thead>
      <tbody>${schedules.map((s) => html`<tr key=${s.id} class="schedule-row" data-schedule=${s.id} data-state=${s.state}>
        <td data-k="state"><${Status} s=${STATE_PILL[s.state] || s.state} label=${s.state} /></td>
        <td data-k="schedule"><a href=${"#/schedules/" + encodeURIComponent(s.id)}>${s.id}</a></td>
        <td data-k="flow">${s.workspace} / <b>${s.flow}</b><div class="muted">overlap ${s.overlap}</div></td>
        <td data-k="expression"><code>${s.expression}</code><div class="muted">${s.timezone}</div></td>
        <td data-k="next">${s.next.length ? html`<ol class="next">${s.next.map((n, i) => html`<li key=${n} data-k=${"next-" + i} title=${n}>${wallClock(n)} <span class="muted">${inTime(n, now)}</span></li>`)}</ol>`
          : html`<span class="muted">${s.state === "paused" ? "paused" : "none to come"}</span>`}</td>
        <td data-k="last">${s.firings.length ? html`<${Outcome} f=${s.firings[0]} />` : html`<span class="muted">not fired yet</span>`}</td>
      </tr>`)}</tbody></table>`}
  </section>`;
}

function Outcome({ f }) {
  return html`<span class="outcome"><${Status} s=${OUTCOME_PILL[f.outcome] || f.outcome} label=${f.outcome} />
    ${f.outcome === "started" && f.run_id ? html` <a data-k="firing-run" href=${"#/runs/" + encodeURIComponent(f.run_id)}>${f.run_id}</a>` : null}
    <span class="muted" title=${f.scheduled_at}> ${f.scheduled_at}</span>${f.reason ? html`<div class="muted reason">${f.reason}</div>` : null}</span>`;
}

export function SchedulePage({ id, live }) {
  const { got: schedule, error } = usePolled("schedules/" + encodeURIComponent(id), live);
  const { got: page } = usePolled("runs?schedule=" + encodeURIComponent(id) + "&limit=25", live);
  const now = useNow(true);
  if (!schedule) {
    if (error && (error.status === 401 || error.status === 403)) return html`<${SignIn} error=${error} />`;
    return html`<section class="card"><${PageTitle} cls="run-id">${id}<//><p class=${error ? "err" : "muted"}>${error ? `Cannot show this schedule: ${error.message}` : "Loading…"}</p></section>`;
  }
  const runs = page ? page.runs : [];
  return html`<div class="schedule" data-schedule=${schedule.id} data-state=${schedule.state}>
    <section class="card head">
      <div class="title"><a class="back" href="#/schedules">← schedules</a><${PageTitle} cls="run-id">${schedule.id}<//><${Status} s=${STATE_PILL[schedule.state]} label=${schedule.state} /></div>
      <div class="head-row"><dl class="facts">
        <${Fact} k="flow" v=${schedule.workspace + " / " + schedule.flow} />
        <${Fact} k="expression" v=${schedule.expression} />
        <${Fact} k="zone" v=${schedule.timezone} />
        <${Fact} k="overlap" v=${schedule.overlap} />
        <${Fact} k="made" v=${m.age(schedule.created_at, now)} title=${schedule.created_at} />
      </dl></div>
      <h4 class="next-head">next firings</h4>
      ${schedule.next.length ? html`<ol class="next" data-k="next">${schedule.next.map((n) => html`<li key=${n} title=${n}>${wallClock(n)} <span class="muted">${inTime(n, now)}</span></li>`)}</ol>`
        : html`<p class="muted" data-k="next">${schedule.state === "paused" ? "Paused: nothing fires until it is resumed." : "It fires no more."}</p>`}
    </section>
    <section class="card"><h2>Runs it started</h2>
      ${runs.length ? html`<table class="runs" data-k="schedule-runs"><thead><tr><th>status</th><th>run</th><th>firing</th><th class="num">cost</th><th class="num">took</th></tr></thead>
        <tbody>${runs.map((r) => html`<tr key=${r.id} class="run-row" data-run=${r.id}>
          <td><${Status} s=${m.shownStatus(r)} /></td>
          <td data-k="run"><a href=${"#/runs/" + encodeURIComponent(r.id)}>${r.id}</a></td>
          <td data-k="scheduled-at">${r.scheduled_at}</td>
          <td class="num">${m.usd(r.cost_usd)}</td>
          <td class="num">${m.duration((r.finished_at ? m.at(r.finished_at) : now) - m.at(r.created_at))}</td>
        </tr>`)}</tbody></table>` : html`<p class="muted" data-k="no-runs">No run yet.</p>`}
    </section>
    <section class="card"><h2>Latest firings</h2>
      ${schedule.firings.length ? html`<ul class="firings" data-k="firings">${schedule.firings.map((f) => html`<li key=${f.scheduled_at} data-outcome=${f.outcome}><${Outcome} f=${f} /></li>`)}</ul>`
        : html`<p class="muted">Not fired yet.</p>`}
    </section>
  </div>`;
}
