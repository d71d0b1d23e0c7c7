// Talking to the API: every request of the viewer goes through `api` (one place for its
// headers, its credentials and how an error answer reads), and a run is followed live by
// `useRun`: server-sent events where the server streams (`laneflow serve`), else polling
// (API Gateway cannot stream).
import { useCallback, useEffect, useState } from "preact/hooks";
import * as signin from "./signin.js";

export const BASE = document.getElementById("app").dataset.base || "";
export const POLL_MS = 2000;

export const authHeader = signin.idToken; // the signed-in person's ID token, or null (signin.js)

export async function api(path, opts = {}) {
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
  // Errors are `{"message"}` (every route here) or `{"error"}`; either is what the person reads.
  if (!r.ok) throw Object.assign(new Error(body.message || body.error || "HTTP " + r.status), { status: r.status });
  return body;
}

// The run record, live: server-sent events when the server streams, else polling.
export function useRun(id, live) {
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
