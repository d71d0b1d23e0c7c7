"""agent.md `network:` under the sandbox: a sandboxed step whose list names 127.0.0.1:<one>
reaches it through laneflow's egress proxy (a plain request, a CONNECT tunnel, python3's
urllib), gets a 403 from 127.0.0.1:<two>, which is a warning on the step, and reaches
nothing when it ignores the proxy (no route out of its namespace). Run with laneflow as
root and as a plain user (as the sandbox's own probes are), then end to end on both stores
through the definition's sandbox worker. Under the plain-subprocess fallback (no network
namespace) `network_enforce: true` refuses the step, naming the list. Every probe targets
loopback only, each bounded in time."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contract.store.backends import BACKENDS
from helpers import Sink, as_nobody, data_of, error_of, step_job
from network_servers import http_server, pattern, raw_listener

from laneflow.adapters.executors.egress_proxy import forwarder_python
from laneflow.adapters.executors.isolation import BUBBLEWRAP, SUBPROCESS, Isolation, bubblewrap_available
from laneflow.adapters.executors.registry import StepTools
from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.errors import StepFailed
from laneflow.domain.records import EventType, RunStatus, StepStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

needs_bubblewrap = pytest.mark.skipif(
    not bubblewrap_available() or forwarder_python() is None or shutil.which("curl") is None,
    reason="bubblewrap, a system python3 or curl is missing here",
)

PROBES = {
    "allowed": "curl -sS -f --max-time 10 http://127.0.0.1:{one}/allowed",
    "refused": "curl -sS --max-time 10 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{two}/refused",
    "tunnel": "curl -sS -f --max-time 10 --proxytunnel http://127.0.0.1:{one}/tunnel",
    "python": "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{one}/py', timeout=10).read().decode())\"",
    "no proxy": "curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{one}/direct",
    "raw socket": "exec 3<>/dev/tcp/127.0.0.1/{raw} && echo connected",
    # Megabytes each way through the forwarder, the plain way and tunnelled, byte for byte.
    "download": "curl -sS -f --max-time 30 http://127.0.0.1:{one}/bytes/4000000 | sha256sum | cut -c1-64",
    "tunnelled download": "curl -sS -f --max-time 30 -p http://127.0.0.1:{one}/bytes/3000000 | sha256sum | cut -c1-64",
    "upload": "head -c 3000000 /dev/urandom > up.bin && sha256sum up.bin | cut -c1-64 && "
    "curl -sS -f --max-time 30 -H 'Expect:' --data-binary @up.bin http://127.0.0.1:{one}/up",
}


@pytest.fixture
def servers() -> Iterator[dict[str, Any]]:
    with http_server() as one, http_server() as two, raw_listener() as raw:
        yield {"one": one, "two": two, "raw": raw}


def _workspace(top: Path) -> Path:
    root = top / "ws"
    (root / "agents" / "worker").mkdir(parents=True)
    (root / "agents" / "worker" / "agent.md").write_text("---\ntools: [bash]\n---\nYou fetch.\n")
    return root


def probe_all(top: Path, isolation: Isolation, ports: dict[str, int]) -> dict[str, Any]:
    """Each probe as a bash call of a step whose list names `one` and `raw` (what it got,
    whether it was an error) and the step's events."""
    sink = Sink()
    network = (f"127.0.0.1:{ports['one']}", f"127.0.0.1:{ports['raw']}")
    tools = StepTools(step_job(_workspace(top), tools=("bash",), network=network), sink, isolation=isolation)
    tools.prepare()
    seen: dict[str, Any] = {"_uid": os.geteuid()}
    for name, command in PROBES.items():
        try:
            seen[name] = {"ok": True, "said": tools.run("bash", {"command": command.format(**ports)})}
        except ToolError as error:
            seen[name] = {"ok": False, "said": str(error)}
    seen["_events"] = sink.events
    return seen


def _as_a_plain_user(isolation: Isolation, ports: dict[str, int]) -> dict[str, Any]:
    """The probes in a laneflow that is nobody, in a folder it owns."""
    top = Path(tempfile.mkdtemp(prefix="laneflow-network-"))
    try:
        seen: dict[str, Any] = as_nobody(top, lambda: probe_all(top, isolation, ports), "the plain user's probes")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return seen


def stdout(said: str) -> str:
    return said.split("--- stdout ---\n", 1)[1].split("\n--- stderr ---", 1)[0]


def assert_only_the_list_passed(seen: dict[str, Any], ports: dict[str, Any], raw_waiting: int) -> None:
    one, two = ports["one"], ports["two"]
    assert seen["allowed"]["ok"] and stdout(seen["allowed"]["said"]) == f"hello from {one} /allowed\n", seen["allowed"]
    assert seen["tunnel"]["ok"] and stdout(seen["tunnel"]["said"]) == f"hello from {one} /tunnel\n", seen["tunnel"]
    assert seen["python"]["ok"] and stdout(seen["python"]["said"]) == f"hello from {one} /py\n\n", seen["python"]
    assert stdout(seen["refused"]["said"]) == "403", seen["refused"]
    # Ignoring the proxy reaches nothing: there is no route out of the sandbox's namespace.
    assert not seen["no proxy"]["ok"] and "hello" not in seen["no proxy"]["said"], seen["no proxy"]
    assert not seen["raw socket"]["ok"] and "connected" not in stdout(seen["raw socket"]["said"]), seen["raw socket"]
    assert raw_waiting == 0  # nothing reached the listed raw listener, which only a direct connection would
    for name, size in (("download", 4_000_000), ("tunnelled download", 3_000_000)):
        assert stdout(seen[name]["said"]) == hashlib.sha256(pattern(size)).hexdigest() + "\n", seen[name]
    sent, echoed = stdout(seen["upload"]["said"]).split()
    assert sent == echoed, seen["upload"]
    events = seen["_events"]
    trace = events[0][1]
    assert trace.startswith(f"isolation: bubblewrap, network only to 127.0.0.1:{one}, 127.0.0.1:{ports['raw']} through "), trace
    refusals = [(kind, data) for kind, _, data in events if data and data.get("refused")]
    assert refusals == [("warning", {"host": "127.0.0.1", "port": two, "refused": True})]


@needs_bubblewrap
@pytest.mark.skipif(os.geteuid() != 0, reason="laneflow is not root here: the plain-user probes cover this machine")
def test_a_root_laneflows_sandboxed_step_reaches_exactly_its_list(tmp_path: Path, servers: dict[str, Any]) -> None:
    ports = {"one": servers["one"], "two": servers["two"], "raw": servers["raw"].port}
    seen = probe_all(tmp_path, BUBBLEWRAP, ports)
    assert seen["_uid"] == 0
    assert_only_the_list_passed(seen, ports, servers["raw"].waiting())


@needs_bubblewrap
def test_a_plain_users_sandboxed_step_reaches_exactly_its_list(tmp_path: Path, servers: dict[str, Any]) -> None:
    ports = {"one": servers["one"], "two": servers["two"], "raw": servers["raw"].port}
    seen = probe_all(tmp_path, BUBBLEWRAP, ports) if os.geteuid() != 0 else _as_a_plain_user(BUBBLEWRAP, ports)
    assert seen["_uid"] != 0
    assert_only_the_list_passed(seen, ports, servers["raw"].waiting())


def test_without_a_network_namespace_network_enforce_refuses_the_step_naming_its_list(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    job = step_job(ws, tools=("bash",), network=("pypi.org", "127.0.0.1:8080"), network_enforce=True)
    with pytest.raises(
        StepFailed, match=r"no network namespace\): its network: list \(pypi.org, 127.0.0.1:8080\) cannot be enforced"
    ):
        StepTools(job, Sink(), isolation=SUBPROCESS).prepare()
    sink = Sink()  # without network_enforce it runs, and its trace says what is not enforced
    StepTools(step_job(ws, tools=("bash",), network=("pypi.org",)), sink, isolation=SUBPROCESS).prepare()
    [(_, trace, data)] = sink.events
    assert "network not enforced (its egress proxy to pypi.org is there for programs that use it)" in trace
    assert data is not None and data["network"] == ["pypi.org"] and data["network_enforced"] is False


def test_the_trace_of_a_step_without_a_list_says_no_network(tmp_path: Path) -> None:
    sink = Sink()
    StepTools(step_job(_workspace(tmp_path), tools=("bash",)), sink, isolation=BUBBLEWRAP).prepare()
    [(_, trace, data)] = sink.events
    assert trace.startswith("isolation: bubblewrap, no network; ") and data is not None and data["network"] == "none"


# -- end to end, on both stores ----------------------------------------------------------------


@pytest.fixture
def svc(store_kind: str, tmp_path: Path) -> Iterator[Services]:
    with BACKENDS[store_kind](tmp_path) as store:
        yield for_store(store, Settings(capture_dir=str(tmp_path / "captures")))


@needs_bubblewrap
def test_a_sandboxed_step_reaches_its_list_and_its_refusals_are_on_the_step_on_both_stores(
    svc: Services, tmp_path: Path, servers: dict[str, Any]
) -> None:
    one, two = servers["one"], servers["two"]
    calls = [PROBES[name].format(one=one, two=two, raw=servers["raw"].port) for name in ("allowed", "refused", "no proxy")]
    stub = "".join(f"tool: bash {json.dumps({'command': c})}\n" for c in calls) + "===\nFetched.\n"
    root = tmp_path / "ws"
    (root / "agents" / "fetcher").mkdir(parents=True)
    (root / "flows").mkdir()
    (root / "AGENTS.md").write_text("---\nmodel: stub\nnetwork_enforce: true\n---\nRules.\n")
    (root / "agents" / "fetcher" / "agent.md").write_text(
        f"---\ntools: [bash]\nnetwork:\n  - 127.0.0.1:{one}\nstub: |\n{textwrap.indent(stub, '  ')}---\nYou fetch.\n"
    )
    (root / "flows" / "fetch.yaml").write_text("steps:\n  - agent: fetcher\n    instruction: Fetch.\n")
    run = create_run(svc, root, "fetch", {})
    local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
    final = svc.store.get_run(run.tenant, run.id)
    assert final.status == RunStatus.completed, final.error
    step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    assert step.status == StepStatus.completed
    [trace] = [e for e in step.events if e.text.startswith("isolation: ")]
    assert f"network only to 127.0.0.1:{one} through laneflow's egress proxy" in trace.text
    assert data_of(trace)["network"] == [f"127.0.0.1:{one}"]
    [refusal] = [e for e in step.events if e.data and e.data.get("refused")]
    assert refusal.type == EventType.warning and refusal.data == {"host": "127.0.0.1", "port": two, "refused": True}
    outputs = [
        json.loads((tmp_path / "captures" / data_of(e)["capture"]).read_text())["output"] for e in step.events if e.type == "tool"
    ]
    allowed, refused, direct = outputs
    assert stdout(allowed) == f"hello from {one} /allowed\n" and stdout(refused) == "403"
    assert direct.startswith("exit code: 7") and "hello" not in direct  # curl: could not connect


def test_forced_to_the_fallback_network_enforce_refuses_a_step_with_a_list_before_any_turn_on_both_stores(
    store_kind: str, tmp_path: Path
) -> None:
    root = tmp_path / "ws"
    (root / "agents" / "fetcher").mkdir(parents=True)
    (root / "flows").mkdir()
    (root / "AGENTS.md").write_text("---\nmodel: stub\nnetwork_enforce: true\n---\nRules.\n")
    stub = 'tool: bash {"command": "curl -sS --max-time 5 http://127.0.0.1:9/"}\n===\nFetched.\n'
    (root / "agents" / "fetcher" / "agent.md").write_text(
        f"---\ntools: [bash]\nnetwork: [pypi.org, '*.pythonhosted.org']\nstub: |\n{textwrap.indent(stub, '  ')}---\nYou fetch.\n"
    )
    (root / "flows" / "fetch.yaml").write_text("steps:\n  - agent: fetcher\n    instruction: Fetch.\n")
    # LANEFLOW_ISOLATION=subprocess: the plain subprocess, which has no network namespace.
    settings = Settings.from_env({"LANEFLOW_ISOLATION": "subprocess", "LANEFLOW_CAPTURE_DIR": str(tmp_path / "captures")})
    with BACKENDS[store_kind](tmp_path) as store:
        svc = for_store(store, settings)
        run = create_run(svc, root, "fetch", {})
        local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
        final = svc.store.get_run(run.tenant, run.id)
        step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    assert final.status == RunStatus.failed and step.status == StepStatus.failed and step.attempts == 1  # not retried
    said = error_of(step)
    assert "no network namespace" in said and "its network: list (pypi.org, *.pythonhosted.org) cannot be enforced" in said
    assert step.calls == [] and not [e for e in step.events if e.type == "tool"]
