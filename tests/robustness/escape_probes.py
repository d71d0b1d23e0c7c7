"""Escape probes against the fence around a step's programs: each probe is a bash call a
hostile agent could make, run through the step's tools the way a step runs them, and what
the host saw after it (a marker file, a definition's bytes, a connection, a relay call).

Importable (`probe_all`) and runnable as a program (`python -m robustness.escape_probes DIR`,
which prints the results as JSON), so the same probes run in laneflow's own process and in
one started as a plain user. What held is judged by the tests, not here."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from helpers import Sink, step_job

from laneflow.adapters.engine.sandbox import CallbackRelay
from laneflow.adapters.executors import isolation
from laneflow.adapters.executors.isolation import BUBBLEWRAP, MIB, Limits
from laneflow.adapters.executors.registry import StepTools
from laneflow.adapters.executors.tools import ToolError

CANARY = f"laneflow-canary-{uuid.uuid4().hex}"

# `size: small` held small enough that filling it takes a moment, not a GiB.
SMALL = Limits(cpu_s=20, memory_bytes=512 * MIB, processes=32, scratch_bytes=8 * MIB)

FORK = (
    "python3 -c 'import os, time\n"
    "n = 0\n"
    "while n < 2000:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        time.sleep(3)\n"
    "        os._exit(0)\n"
    "    n += 1\n"
    'print("forked", n)\''
)


class _Callbacks:
    """Another run's engine: what reaches its relay is written down."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return []

        return call


def _workspace(top: Path) -> Path:
    root = top / "ws"
    (root / "agents" / "worker").mkdir(parents=True)
    (root / "agents" / "worker" / "agent.md").write_text("---\ntools: [bash]\n---\nYou work.\n")
    return root


def _run(tools: StepTools, command: str) -> dict[str, Any]:
    try:
        return {"ok": True, "said": tools.run("bash", {"command": command})}
    except ToolError as error:
        return {"ok": False, "said": str(error)}


def _listener() -> tuple[socket.socket, list[bool]]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(3)
    accepted: list[bool] = []

    def accept() -> None:
        try:
            conn, _ = server.accept()
            accepted.append(True)
            conn.close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    return server, accepted


def _used(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def probe_all(top: Path) -> dict[str, dict[str, Any]]:
    """Every probe, run under bubblewrap in a workspace made under `top`: name -> what the
    tool answered (`ok`, `said`) and what the host saw after it. The caller has put CANARY
    in this process's environment and SMALL in `isolation.SIZES` (see `main`)."""
    root = _workspace(top)
    job = step_job(root, run_id="run-escape", index=0, tools=("bash",), size="small")
    tools = StepTools(job, Sink(), isolation=BUBBLEWRAP)
    agent_md = root / "agents" / "worker" / "agent.md"
    marker = f"laneflow-marker-{uuid.uuid4().hex[:12]}"
    out: dict[str, dict[str, Any]] = {}

    def probe(name: str, command: str, **seen: Any) -> dict[str, Any]:
        out[name] = {**_run(tools, command), **seen}
        return out[name]

    probe("remount /etc", f"mount -o remount,rw,bind /etc; echo x > /etc/{marker}")
    out["remount /etc"]["host_file"] = os.path.exists(f"/etc/{marker}")
    probe("remount /usr", f"mount -o remount,rw,bind /usr; echo x > /usr/{marker}")
    out["remount /usr"]["host_file"] = os.path.exists(f"/usr/{marker}")
    probe("new user namespace", f"unshare -Urm sh -c 'mount -t tmpfs none /etc && echo x > /etc/{marker} && echo inside'")
    out["new user namespace"]["host_file"] = os.path.exists(f"/etc/{marker}")
    probe("unmask /etc/shadow", "umount /etc/shadow; umount -l /etc/shadow; cat /etc/shadow")
    before = agent_md.read_text()
    probe(
        "unbind agent.md",
        "umount agents/worker/agent.md; umount -l agents/worker/agent.md; echo 'tools: [everything]' > agents/worker/agent.md",
    )
    out["unbind agent.md"]["unchanged"] = agent_md.read_text() == before
    probe("read the host's home", "ls -a /root; ls -a /home")
    probe("laneflow's environ", f"cat /proc/{os.getpid()}/environ; cat /proc/*/environ | tr '\\0' '\\n'")
    server, accepted = _listener()
    port = server.getsockname()[1]
    probe("loopback network", f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected")
    server.close()
    out["loopback network"]["accepted"] = bool(accepted)

    other_run = _Callbacks()
    relay = CallbackRelay(other_run)
    path = relay.listen()
    probe(
        "another run's relay",
        "python3 -c 'import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
        f's.connect("{path}")\ns.sendall(b"{{\\"op\\": \\"succeed_all\\", \\"tokens\\": [\\"t\\"]}}\\n")\nprint(s.recv(100))\'',
    )
    out["another run's relay"]["relay_calls"] = list(other_run.calls)

    forked = probe("fork bomb", FORK)
    forked["limit"] = SMALL.processes
    words = forked["said"].split("forked ")
    forked["forked"] = int(words[1].split()[0]) if len(words) > 1 else None

    probe("one huge file", "dd if=/dev/zero of=huge bs=1M count=64 2>&1; ls -l huge")
    out["one huge file"]["bytes"] = (root / "huge").stat().st_size if (root / "huge").exists() else 0
    out["one huge file"]["limit"] = SMALL.file_bytes
    (root / "huge").unlink(missing_ok=True)
    probe(
        "fill the scratch",
        "mkdir fill; for i in $(seq 1 64); do head -c 1048576 /dev/zero > fill/$i; sleep 0.05; done; echo filled",
    )
    out["fill the scratch"]["bytes"] = _used(root / "fill") if (root / "fill").exists() else 0
    out["fill the scratch"]["limit"] = SMALL.scratch_bytes
    out["_canary"] = {"value": CANARY, "uid": os.geteuid()}
    return out


def main() -> None:
    top = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    os.environ["LANEFLOW_CANARY"] = CANARY  # in laneflow's own environment, for the environ probes
    isolation.SIZES["small"] = SMALL
    print(json.dumps(probe_all(top)))


if __name__ == "__main__":
    main()
