// The one confirmation dialog of the page: `ask({...})` opens it and resolves to
// `{ reason }` when the person confirms, or null when they cancel (Cancel, Escape, a click
// outside). It is modal: the rest of the page is inert while it is open, Tab and Shift+Tab
// stay inside it, and the focus goes back to what opened it.
import { useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";
import { html } from "./ui.js";

let show = null;

// title, text, confirm (the button's words), reason (the reason field's label, or absent).
export function ask(options) {
  return new Promise((resolve) => {
    if (!show) return resolve(null);
    show({ ...options, resolve, opener: document.activeElement });
  });
}

const FOCUSABLE = "button:not([disabled]), textarea:not([disabled]), input:not([disabled]), select:not([disabled]), a[href], [tabindex]:not([tabindex='-1'])";

// The page's own parts the dialog shuts out while it is open.
const background = () => [...document.querySelectorAll("#app > header, #app > main")];

export function DialogHost() {
  const [open, setOpen] = useState(null);
  const [reason, setReason] = useState("");
  const box = useRef(null);
  useEffect(() => {
    // a second ask while one is open (two quick presses) answers the first: no
    show = (o) => { setReason(""); setOpen((was) => { was && was.resolve(null); return o; }); };
    return () => { show = null; };
  }, []);
  // As it is drawn (not after the paint): no moment where it shows but the page is not inert.
  useLayoutEffect(() => {
    if (!open) return undefined;
    background().forEach((el) => { el.inert = true; });
    const first = box.current.querySelector("textarea") || box.current.querySelector(FOCUSABLE);
    first && first.focus();
    return () => background().forEach((el) => { el.inert = false; });
  }, [open]);
  if (!open) return null;
  const close = (answer) => {
    background().forEach((el) => { el.inert = false; }); // now: an inert element takes no focus
    setOpen(null);
    open.resolve(answer);
    // back to what opened it, or (if a re-render took it away) the page's heading
    const back = open.opener && open.opener.isConnected ? open.opener : document.querySelector("h1");
    back && back.focus();
  };
  const onKeyDown = (e) => {
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); close(null); return; }
    if (e.key !== "Tab") return;
    const all = [...box.current.querySelectorAll(FOCUSABLE)];
    const i = all.indexOf(document.activeElement);
    if (e.shiftKey && i <= 0) { e.preventDefault(); all[all.length - 1].focus(); }
    else if (!e.shiftKey && i === all.length - 1) { e.preventDefault(); all[0].focus(); }
  };
  const submit = (e) => { e.preventDefault(); close({ reason: reason.trim() }); };
  // (its default would move the focus to the page, from where close() has just put it)
  const outside = (e) => { if (e.target === e.currentTarget) { e.preventDefault(); close(null); } };
  return html`<div class="backdrop" onMouseDown=${outside}>
    <div class="dialog" role="dialog" aria-modal="true" aria-labelledby="dialog-title" aria-describedby="dialog-text" ref=${box} onKeyDown=${onKeyDown} data-k="dialog">
      <h2 id="dialog-title">${open.title}</h2>
      <p id="dialog-text">${open.text}</p>
      <form onSubmit=${submit}>
        ${open.reason && html`<label for="dialog-reason">${open.reason} <span class="muted">(optional; kept in the run's record)</span></label>
          <textarea id="dialog-reason" rows="3" maxlength="500" value=${reason} onInput=${(e) => setReason(e.target.value)}></textarea>`}
        <div class="dialog-buttons">
          <button type="button" onClick=${() => close(null)}>Cancel</button>
          <button type="submit" class=${open.tone || ""}>${open.confirm}</button>
        </div>
      </form>
    </div>
  </div>`;
}
