"""The run viewer in a real browser, for tests and for the README's screenshots: Debian's
headless Chromium driven by Playwright's Python package (never `playwright install`: nothing is
downloaded), and a real `laneflow serve` on 127.0.0.1 over a temporary SQLite store, with the
Claude executor pointed at the local Messages API imitation so runs have real cache figures.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from laneflow.adapters.local.workspaces import FolderWorkspaces
from laneflow.adapters.store import open_store
from laneflow.domain.records import Run
from laneflow.entrypoints.serve import ApiServer, make_server
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store, local_drives
from laneflow_dev.imitation import MessagesImitation, Responder

CHROMIUM = "/usr/bin/chromium"

# No GPU, no QUIC, no first-run, no background calls home: the browser talks to 127.0.0.1 only.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

KEY = "sk-imitation-viewer"


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/system-packages.sh does)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright's Python package is not installed (pip install -e '.[dev]')"
    return None


@dataclass
class Served:
    """A running `laneflow serve` and what it runs on."""

    svc: Services
    server: ApiServer
    url: str
    tenant: str

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST to the API (as a person's script would); its JSON answer."""
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            answered: dict[str, Any] = json.loads(answer.read())
        return answered

    def start(self, workspace: str, flow: str, **body: Any) -> str:
        """Start a run through the API; its id."""
        run_id: str = self.post("/runs", {"workspace": workspace, "flow": flow, **body})["id"]
        return run_id

    def run(self, run_id: str) -> Run:
        return self.svc.store.get_run(self.tenant, run_id)

    def wait(self, run_id: str, *statuses: str, timeout_s: float = 60) -> Run:
        """The run once its status is one of `statuses` (it fails the caller after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.run(run_id)
            if run.status in statuses:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} is {run.status}, not {'/'.join(statuses)}, after {timeout_s} s")
            time.sleep(0.05)


@contextmanager
def served(workspaces: dict[str, Path], responder: Responder | None = None, **more_settings: Any) -> Iterator[Served]:
    """`laneflow serve` on a free port of 127.0.0.1, over copies of `workspaces` (by the name
    runs are started with) and a fresh SQLite store, driving runs on this process's threads;
    Claude models answer from the Messages API imitation (with `responder`'s replies).
    `more_settings` are the server's too (the viewer's sign-in: signin_domain, signin_client_id)."""
    folder = Path(tempfile.mkdtemp(prefix="laneflow-viewer-"))
    try:
        for name, source in workspaces.items():
            shutil.copytree(source, folder / "ws" / name)
        with MessagesImitation(ttft_ms=300, token_ms=2, api_keys={KEY}, responder=responder) as api:
            settings = Settings(
                anthropic_api_key=SecretStr(KEY),
                anthropic_base_url=api.url,
                capture_dir=str(folder / "captures"),
                **more_settings,
            )
            svc = for_store(open_store(f"sqlite:///{folder / 'laneflow.db'}"), settings)
            svc.workspaces = FolderWorkspaces(folder / "ws")
            svc.drives = local_drives(svc)
            server = make_server(svc, "127.0.0.1", 0)
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            try:
                yield Served(svc, server, server.url, settings.tenant)
            finally:
                server.shutdown()
                server.server_close()
                thread.join(5)
                svc.store.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
