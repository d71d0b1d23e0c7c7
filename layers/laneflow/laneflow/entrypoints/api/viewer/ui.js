// Small pieces every page uses: the template tag, a status badge, a fact, the clock, the
// polite announcer (what changed, said to a screen reader), and the sign-in card.
import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";
import * as signin from "./signin.js";

export const html = htm.bind(h);

export const Status = ({ s, label }) => html`<span class=${"pill st-" + s}>${label || s}</span>`;

export const Fact = ({ k, v, title }) => html`<div class="fact" title=${title || ""}><dt>${k}</dt><dd>${v}</dd></div>`;

export function useNow(active) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    if (!active) return undefined;
    const t = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(t);
  }, [active]);
  return now;
}

// One live region for the whole page: a status that changes is said once, politely.
let say = null;
export const announce = (text) => say && say(text);

export function Announcer() {
  const [text, setText] = useState("");
  useEffect(() => { say = setText; return () => { say = null; }; }, []);
  return html`<div class="sr-only" role="status" aria-live="polite" aria-atomic="true" data-k="announce">${text}</div>`;
}

// A page's heading takes the focus when the page opens, so a keyboard or screen reader user
// starts there (not on a link of the page they left).
export function PageTitle({ children, cls }) {
  const ref = useRef(null);
  useEffect(() => { ref.current && ref.current.focus({ preventScroll: true }); }, []);
  return html`<h1 ref=${ref} tabindex="-1" class=${cls || ""}>${children}</h1>`;
}

// A call refused for want of a person the API takes (signin.js signs in again by itself, but
// not round and round: an account without a tenant would be refused each time).
export function SignIn({ error }) {
  return html`<section class="card signin" data-k="signin"><h1>Sign in</h1><p>${error.message}.</p>
    ${signin.enabled ? html`<p class="muted">The API refused this account: it may have no tenant (its custom:tenant attribute).</p>
      <div class="actions"><button onClick=${() => signin.signIn()}>Sign in again</button><button onClick=${signin.signOut}>Sign out</button></div>`
    : html`<p class="muted">This API takes signed calls and this viewer signs no one in: people open the viewer at the stack's PeopleUrl.</p>`}</section>`;
}
