// The run viewer: the list of runs at `#/` (its page, filter and search in the query:
// `#/?status=failed&q=words&before=ID`), a run's page at `#/runs/ID`, its raw event history
// at `#/runs/ID/history`; the schedules at `#/schedules` and one at `#/schedules/ID`. Preact + htm, vendored (vendor/VENDORED.md), no build step; each
// part is a module of its own, served beside this one. Everything a record holds is
// rendered as text by Preact (never as HTML).
import { render } from "preact";
import { useEffect, useMemo, useState } from "preact/hooks";
import { DialogHost } from "./dialog.js";
import { HistoryPage } from "./history.js";
import { RunList } from "./list.js";
import * as m from "./model.js";
import { RunPage } from "./run.js";
import { ScheduleList, SchedulePage } from "./schedules.js";
import { Announcer, html } from "./ui.js";

function readRoute() {
  const schedule = /^#\/schedules(?:\/([^/?]+))?\/?$/.exec(location.hash);
  if (schedule) return schedule[1] ? { page: "schedule", id: decodeURIComponent(schedule[1]) } : { page: "schedules" };
  const hit = /^#\/runs\/([^/?]+)(\/history)?(?:\?(.*))?$/.exec(location.hash);
  if (hit) return { page: hit[2] ? "history" : "run", id: decodeURIComponent(hit[1]), params: new URLSearchParams(hit[3] || "") };
  const query = /^#\/?\?(.*)$/.exec(location.hash);
  return { page: "list", list: m.readListState(query ? query[1] : "") };
}

// The route, and `go` to change it: pushed onto the history (Back undoes it) or, for what
// changes as a person types, put in place of the current entry.
function useRoute() {
  const [route, setRoute] = useState(readRoute);
  useEffect(() => {
    const on = () => setRoute(readRoute());
    addEventListener("hashchange", on);
    addEventListener("popstate", on);
    return () => { removeEventListener("hashchange", on); removeEventListener("popstate", on); };
  }, []);
  const go = useMemo(() => (hash, { replace } = {}) => {
    if (hash === location.hash) return;
    history[replace ? "replaceState" : "pushState"](null, "", hash);
    setRoute(readRoute());
  }, []);
  return [route, go];
}

const TITLES = {
  list: () => "laneflow runs",
  run: (r) => `${r.id} · laneflow`,
  history: (r) => `history of ${r.id} · laneflow`,
  schedules: () => "laneflow schedules",
  schedule: (r) => `${r.id} · laneflow schedules`,
};

function App() {
  const [route, go] = useRoute();
  const [state, setState] = useState("live");
  const live = useMemo(() => ({ set: setState }), []);
  const [offline, setOffline] = useState(!navigator.onLine);
  useEffect(() => {
    const on = () => setOffline(!navigator.onLine);
    addEventListener("online", on); addEventListener("offline", on);
    return () => { removeEventListener("online", on); removeEventListener("offline", on); };
  }, []);
  useEffect(() => { document.title = TITLES[route.page](route); }, [route.page, route.id]);
  const where = { list: "runs", run: "run", history: "history", schedules: "schedules", schedule: "schedule" }[route.page];
  return html`<header class="top"><a class="brand" href="#/">laneflow</a><span class="muted where">${where}</span>
      <nav class="sections" aria-label="sections"><a href="#/" aria-current=${route.page === "list" ? "page" : null}>Runs</a>
        <a href="#/schedules" data-k="schedules-link" aria-current=${route.page.startsWith("schedule") ? "page" : null}>Schedules</a></nav>
      <span class="grow" /><span class=${"live " + (offline ? "offline" : state)} data-k="live">${offline ? "offline" : state}</span></header>
    <main>${route.page === "run" ? html`<${RunPage} key=${route.id} id=${route.id} live=${live} />`
      : route.page === "schedules" ? html`<${ScheduleList} live=${live} />`
      : route.page === "schedule" ? html`<${SchedulePage} key=${route.id} id=${route.id} live=${live} />`
      : route.page === "history" ? html`<${HistoryPage} key=${route.id} id=${route.id} live=${live} params=${route.params} go=${go} />`
      : html`<${RunList} live=${live} state=${route.list} go=${go} />`}</main>
    <${DialogHost} /><${Announcer} />`;
}

const root = document.getElementById("app");
root.textContent = "";
render(html`<${App} />`, root);
