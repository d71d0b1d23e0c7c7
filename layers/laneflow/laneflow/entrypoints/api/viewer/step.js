// A step of a run's timeline: its row (a bar from its start to its end, its gate wait and
// first token marked) and, opened, its detail: figures, message, result, prompt layers
// against the agent's previous step, model calls, events, captures, and the answer box.
import { useEffect, useState } from "preact/hooks";
import { api } from "./api.js";
import * as m from "./model.js";
import { Fact, Status, html } from "./ui.js";

export function StepRow({ s, g, run, now, ended, open, toggle }) {
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
    ${(s.events || []).length > 0 && html`<div class="block"><h4>events <a class="more" href=${history(run, s)}>this step's history</a></h4><ul class="events">${s.events.map((e, i) => html`<li key=${i} class=${"ev-" + e.type}><span class="when">${rel(e.t)}</span><span class="type">${e.type}</span><span class="text">${e.text}</span></li>`)}</ul></div>`}
    <${Captures} s=${s} run=${run} />
    <div class="answer-slot" data-slot="answer">${s.status === "running" && html`<${AnswerBox} s=${s} run=${run} />`}</div>
  </div>`;
}

const history = (run, s, captures) => `#/runs/${encodeURIComponent(run.id)}/history?step=${s.index}${captures ? "&captures=1" : ""}`;

// The step's tool-call captures (each call's input and output, kept by the capture sink: a
// folder beside the store locally, the captures bucket in the cloud). The API serves no
// capture, so each is shown by its reference; the history lists them with their calls.
function Captures({ s, run }) {
  const kept = m.capturesOf(s);
  if (!kept.length) return null;
  return html`<div class="block captures" data-k="captures"><h4>captures <a class="more" data-k="captures-link" href=${history(run, s, true)}>${kept.length} in the history</a></h4>
    <ul class="refs">${kept.map((e, i) => html`<li key=${i}><span class="type">${e.data.tool || "tool"}</span> <code>${m.captureOf(e)}</code></li>`)}</ul></div>`;
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

