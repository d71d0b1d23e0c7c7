// What a person does to a run: Stop (every run that can be stopped), Approve and Reject (a
// run parked at an approval), Redrive (a run that failed, not one that was stopped). Stop and
// Reject ask first, in the page's dialog, and take a reason the API keeps in the run's record.
import { useState } from "preact/hooks";
import { api } from "./api.js";
import { ask } from "./dialog.js";
import * as m from "./model.js";
import { announce, html } from "./ui.js";

// What each answer says, in a person's words.
const DONE = {
  approve: "approved: the run goes on",
  reject: "rejected: the run failed",
  redrive: "redriven: its failed steps get a new attempt",
};

// "approved: the run goes on" is true until the run ends; then its status says what is true.
const stale = (said, run) => said.ok && said.what !== "reject" && m.ENDED.has(run.status);

export function Actions({ run, onDone, inRow }) {
  const [busy, setBusy] = useState("");
  const [said, setSaid] = useState(null);
  const id = encodeURIComponent(run.id);
  const act = async (what, path, body) => {
    setBusy(what);
    setSaid(null);
    try {
      const out = await api(path, { method: "POST", body });
      const text = out.message || DONE[what] || "done";
      setSaid({ ok: true, text, what });
      announce(`run ${run.id}: ${text}`);
      onDone && onDone();
    } catch (e) {
      const text = `${what} refused${e.status ? ` (HTTP ${e.status})` : ""}: ${e.message}`;
      setSaid({ ok: false, text });
      announce(`run ${run.id}: ${text}`);
    } finally {
      setBusy("");
    }
  };
  const withReason = (body, answer) => (answer.reason ? { ...body, reason: answer.reason } : body);
  const stop = async () => {
    const answer = await ask({
      title: `Stop run ${run.id}?`,
      text: "Stopping is one-way: its running steps end at their next check, and the steps it has not run are skipped.",
      confirm: "Stop the run", tone: "stop", reason: "Why stop it?",
    });
    if (answer) act("stop", `runs/${id}/stop`, withReason({}, answer));
  };
  const reject = async () => {
    const answer = await ask({
      title: `Reject run ${run.id}?`,
      text: "The run fails, rejected by a person, and the steps after its approval are skipped.",
      confirm: "Reject the run", tone: "reject", reason: "Why reject it?",
    });
    if (answer) act("reject", `runs/${id}/approval`, withReason({ approve: false }, answer));
  };
  // In a row of the list, each button also names its run (for a screen reader's list of buttons).
  const named = (words) => html`${words}${inRow && html`<span class="sr-only"> run ${run.id}</span>`}`;
  const parked = run.status === "awaiting-approval";
  return html`<div class="actions">
    ${parked && html`<button type="button" class="approve" disabled=${!!busy} onClick=${() => act("approve", `runs/${id}/approval`, { approve: true })}>${named("Approve")}</button>
      <button type="button" class="reject" disabled=${!!busy} onClick=${reject}>${named("Reject")}</button>`}
    ${m.canStop(run) && html`<button type="button" class="stop" disabled=${!!busy} onClick=${stop}>${named("Stop")}</button>`}
    ${m.stopping(run) && html`<span class="muted stopping" data-k="stopping">stopping…</span>`}
    ${m.canRedrive(run) && html`<button type="button" class="redrive" disabled=${!!busy} onClick=${() => act("redrive", `runs/${id}/redrive`, {})}
      title="go on from where it failed: its failed and skipped steps get a new attempt, its completed steps are kept">${named("Redrive")}</button>`}
    ${said && !stale(said, run) && html`<span class=${said.ok ? "said" : "said err"} data-k="said">${said.text}</span>`}
  </div>`;
}
