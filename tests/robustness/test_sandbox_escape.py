"""The fence around a step's programs, attacked: every probe of `escape_probes` is a bash call
a hostile agent could make, run once with laneflow as root (as in many containers) and once
as a plain user, and each asserts the fence held: no write reached the host, no mask or
read-only bind came off, the limits bound, nothing of laneflow's environment, network or
relays was reached. Then one sandboxed step, through the definition's sandbox worker, tries
the workspace's other agents and its secrets file. Network probes target loopback only."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from contract.store.backends import BACKENDS
from helpers import as_nobody, data_of

from laneflow.adapters.executors import isolation
from laneflow.adapters.executors.isolation import bubblewrap_available
from laneflow.domain.records import RunStatus
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine
from robustness import escape_probes

pytestmark = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap is not installed or cannot make namespaces here")


def assert_the_fence_held(seen: dict[str, dict[str, Any]]) -> None:
    canary = seen.pop("_canary")["value"]
    for name in ("remount /etc", "remount /usr", "new user namespace"):
        assert not seen[name]["ok"] and not seen[name]["host_file"], (name, seen[name]["said"])
    shadow = seen["unmask /etc/shadow"]
    assert not shadow["ok"] and "root:" not in shadow["said"], shadow["said"]
    assert seen["unbind agent.md"]["unchanged"] and not seen["unbind agent.md"]["ok"], seen["unbind agent.md"]["said"]
    assert not seen["read the host's home"]["ok"], seen["read the host's home"]["said"]
    environ = seen["laneflow's environ"]["said"]
    assert canary not in environ and "LANEFLOW_CANARY" not in environ, environ
    net = seen["loopback network"]
    assert not net["ok"] and not net["accepted"] and "connected" not in net["said"].split("--- stdout ---")[1], net["said"]
    relay = seen["another run's relay"]
    assert not relay["ok"] and relay["relay_calls"] == [], relay["said"]
    fork = seen["fork bomb"]
    assert fork["forked"] is not None and 0 < fork["forked"] < fork["limit"], fork["said"]
    huge = seen["one huge file"]
    assert not huge["ok"] and huge["bytes"] <= huge["limit"], huge["said"]
    fill = seen["fill the scratch"]
    # Killed past its size: what it held when killed is at most one measuring interval's
    # writing beyond it (here 1 MiB every 0.05 s, measured every 0.5 s).
    assert not fill["ok"] and "grew past" in fill["said"] and "filled" not in fill["said"], fill["said"]
    assert fill["bytes"] < 64 * isolation.MIB and fill["bytes"] <= fill["limit"] + 16 * isolation.MIB, fill["bytes"]


@pytest.mark.skipif(os.geteuid() != 0, reason="laneflow is not root here: the plain-user probes cover this machine")
def test_a_root_laneflows_programs_cannot_leave_the_fence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANEFLOW_CANARY", escape_probes.CANARY)
    monkeypatch.setitem(isolation.SIZES, "small", escape_probes.SMALL)
    seen = escape_probes.probe_all(tmp_path)
    assert seen["_canary"]["uid"] == 0
    assert_the_fence_held(seen)


def _as_a_plain_user(top: Path) -> dict[str, dict[str, Any]]:
    """The probes in a laneflow that is nobody, in a workspace it owns."""

    def probes() -> dict[str, dict[str, Any]]:
        os.environ["LANEFLOW_CANARY"] = escape_probes.CANARY
        isolation.SIZES["small"] = escape_probes.SMALL
        return escape_probes.probe_all(top)

    seen: dict[str, dict[str, Any]] = as_nobody(top, probes, "the plain user's probes")
    return seen


def test_a_plain_users_programs_cannot_leave_the_fence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:  # this process is the plain user
        monkeypatch.setenv("LANEFLOW_CANARY", escape_probes.CANARY)
        monkeypatch.setitem(isolation.SIZES, "small", escape_probes.SMALL)
        seen = escape_probes.probe_all(tmp_path)
    else:
        top = Path(tempfile.mkdtemp(prefix="laneflow-escape-"))  # pytest's own folder is root's alone
        try:
            seen = _as_a_plain_user(top)
        finally:
            shutil.rmtree(top, ignore_errors=True)
    assert seen["_canary"]["uid"] != 0
    assert_the_fence_held(seen)


# -- through the sandbox worker ------------------------------------------------------------------

PROBES = textwrap.dedent("""\
    tool: bash {"command": "ls agents; cat agents/other/memory/notes.md; cat agents/other/outputs/report.md"}
    tool: bash {"command": "echo planted > agents/other/memory/planted.md && echo planted"}
    tool: bash {"command": "cat .secrets.env; cat ../.secrets.env; ls -a"}
    tool: bash {"command": "for i in 1 2 3; do head -c 400000000 /dev/zero > fill-$i || exit 7; done; echo filled"}
    ===
    Probed.
    """)


def _workspace(top: Path) -> Path:
    ws = top / "ws-escape"
    for folder in ("agents/prober", "agents/other/memory", "agents/other/outputs", "flows"):
        (ws / folder).mkdir(parents=True)
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nRules.\n")
    stub = textwrap.indent(PROBES, "  ")
    (ws / "agents" / "prober" / "agent.md").write_text(
        f"---\nsandbox: true\nsize: small\ntools: [bash]\nstub: |\n{stub}---\nYou probe.\n"
    )
    (ws / "agents" / "other" / "agent.md").write_text("---\ndescription: another\n---\nYou are another.\n")
    (ws / "agents" / "other" / "memory" / "notes.md").write_text("other-agents-memory-marker\n")
    (ws / "agents" / "other" / "outputs" / "report.md").write_text("other-agents-output-marker\n")
    (ws / ".secrets.env").write_text("TIDE_KEY=secrets-file-marker\n")
    (ws / "flows" / "probe.yaml").write_text("steps:\n  - agent: prober\n    instruction: Probe.\n")
    return ws


def test_a_sandboxed_step_sees_no_other_agent_nor_the_secrets_file_and_its_scratch_is_bounded(tmp_path: Path) -> None:
    with BACKENDS["sqlite"](tmp_path) as store:
        svc = for_store(store, Settings(capture_dir=str(tmp_path / "captures")))
        ws = _workspace(tmp_path)
        run = create_run(svc, ws, "probe", {})
        local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
        final = svc.store.get_run(run.tenant, run.id)
        assert final.status == RunStatus.completed, final.error
        step = svc.store.get_step(run.tenant, run.id, 0, detail=True)
    calls = [e for e in step.events if e.type == "tool"]
    [fence] = [e.text for e in step.events if e.text.startswith("isolation: ")]
    assert len(calls) == 4
    outputs = [json.loads((tmp_path / "captures" / data_of(e)["capture"]).read_text())["output"] for e in calls]
    listing, planted, secrets, fill = outputs
    assert "other" not in listing.split("--- stderr ---")[0] and "marker" not in listing, listing
    assert not (ws / "agents" / "other" / "memory" / "planted.md").exists()
    assert "secrets-file-marker" not in secrets and ".secrets.env" not in secrets.split("--- stderr ---")[0], secrets
    # Its scratch is 1 GiB (`size: small`): a tmpfs that size where the worker has one (a
    # write past it fails, so the loop never ends "filled"), else measured while the program
    # runs and after it ends, and past it the call is an error that keeps nothing.
    assert data_of(calls[3]).get("is_error") is True, fill
    stdout = fill.split("--- stderr ---")[0]
    if os.geteuid() == 0:  # the sandbox worker, as root, has a mount namespace and a tmpfs of its own
        assert fence.endswith("a 1 GiB scratch (tmpfs)"), fence
    if fence.endswith("(tmpfs)"):
        assert "No space left on device" in fill and "filled" not in stdout, fill
    else:
        assert "the scratch grew past its 1 GiB" in fill, fill
    assert not list(ws.glob("fill-*"))  # a failed call's files are not kept either
