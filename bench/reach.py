"""Benchmark: what the agent's reach costs over the direct way, per call.

- MCP: one `mcp__tides__high_water` call of examples/almanac's stdio server through a
  step's tools (the SDK's client over a pipe), after the server started, against the same
  function called in this process. Goal: under 50 ms a call.
- Delegation: one `delegate` turn on the stub, inside its caller's attempt, against the
  same agent's turn run as a step of its own (the other way to give it the task): flows of
  N steps on the embedded engine, with and without a delegation each, and with the
  delegate's work as a second group of N steps. Goal: a delegate turn costs less than a
  step of its own.
- The egress proxy: one GET of a local HTTP server (127.0.0.1) through laneflow's proxy
  against the same GET made directly. Goal: under 20 ms a request.

All three goals are wall times: each is reported unmeasured (neither met nor missed) when the
machine was busy, its 1-minute load above its cores before or after that part. Exit 1 when a
measured goal is missed.

    python bench/reach.py [--calls 50] [--steps 50] [--json] [--write]
"""

from __future__ import annotations

import argparse
import http.server
import importlib.util
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from benchlib import Goal, exit_code, goal_table, load, machine, write_section

from laneflow.adapters.executors.egress_proxy import one_request_s, start_proxy
from laneflow.adapters.executors.registry import StepTools, _Silent
from laneflow.adapters.store import open_store
from laneflow.domain.mcp import McpServer
from laneflow.ports import StepJob
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

HERE = Path(__file__).resolve().parent
ALMANAC = HERE.parent / "examples" / "almanac"
SERVER = "agents/researcher/servers/tide_tables.py"
MCP_GOAL_MS = 50.0
PROXY_GOAL_MS = 20.0


def _ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


# -- MCP ---------------------------------------------------------------------------------------


def _direct_high_water() -> Callable[[str], tuple[str, bool]]:
    """The server's own function, loaded in this process (the file answers stdin when run,
    so only its function is taken: the module is read up to its loop)."""
    source = (ALMANAC / SERVER).read_text().split("\nfor line in sys.stdin:", 1)[0]
    spec = importlib.util.spec_from_loader("tide_tables", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, str(ALMANAC / SERVER), "exec"), module.__dict__)
    found: Callable[[str], tuple[str, bool]] = module.high_water
    return found


def mcp_bench(calls: int) -> dict[str, Any]:
    job = StepJob(
        tenant="local",
        run_id="bench",
        index=0,
        attempt=1,
        agent="researcher",
        model="stub",
        item=None,
        run_input={},
        system_stable="",
        system_dynamic="",
        user="",
        workspace_root=str(ALMANAC),
        agent_path="agents/researcher",
        mcp=(McpServer(name="tides", command=sys.executable, args=[SERVER]),),
    )
    tools = StepTools(job, _Silent())
    try:
        started = time.perf_counter()
        tools.run("mcp__tides__high_water", {"port": "Brest"})  # starts the server and lists its tools
        first_s = time.perf_counter() - started
        through: list[float] = []
        for _ in range(calls):
            t = time.perf_counter()
            answer = tools.run("mcp__tides__high_water", {"port": "Brest"})
            through.append(time.perf_counter() - t)
        assert "06:12" in answer, answer
    finally:
        tools.close()
    direct_fn = _direct_high_water()
    direct: list[float] = []
    for _ in range(calls):
        t = time.perf_counter()
        direct_fn("Brest")
        direct.append(time.perf_counter() - t)
    per_call = _ms(through)
    return {
        "mcp_first_call_ms": round(first_s * 1000, 1),
        "mcp_call_ms": per_call,
        "direct_call_ms": _ms(direct),
        "mcp_goal_ms": MCP_GOAL_MS,
    }


# -- delegation --------------------------------------------------------------------------------


def _delegation_workspace(root: Path) -> Path:
    """`delegating`: each step delegates once; `alone`: the same step without it; `two`: the
    step, then the delegate's turn as a step of its own."""
    agents = {
        "boss": {"delegates": ["helper"], "stub": 'tool: delegate {"agent": "helper", "task": "Help."}\n===\nDone.'},
        "plain": {"stub": "Done."},
        "helper": {"stub": "Helped."},
    }
    flows = {
        "delegating": {"steps": [{"agent": "boss", "each": "input.items", "parallel": 1}]},
        "alone": {"steps": [{"agent": "plain", "each": "input.items", "parallel": 1}]},
        "two": {
            "steps": [
                {"agent": "plain", "each": "input.items", "parallel": 1},
                {"agent": "helper", "each": "input.items", "parallel": 1},
            ]
        },
    }
    ws = root / "ws"
    (ws / "flows").mkdir(parents=True)
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nA benchmark.\n")
    for name, front in agents.items():
        (ws / "agents" / name).mkdir(parents=True)
        (ws / "agents" / name / "agent.md").write_text(f"---\n{yaml.safe_dump(front)}---\nYou are {name}.\n")
    for name, flow in flows.items():
        (ws / "flows" / f"{name}.yaml").write_text(yaml.safe_dump({"description": name, **flow}))
    return ws


def delegation_bench(steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = _delegation_workspace(root)
        svc = for_store(open_store(f"sqlite:///{root / 'bench.db'}"))
        engine = local_engine(svc)
        items = {"items": [f"i{n}" for n in range(steps)]}
        walls: dict[str, float] = {}
        for flow in ("alone", "delegating", "two", "alone", "delegating", "two"):  # each twice: the best counts
            run = create_run(svc, ws, flow, items, options={"gate": False})
            started = time.perf_counter()
            done = engine.drive(run.tenant, run.id).run
            wall = time.perf_counter() - started
            assert done.status == "completed", done.error
            walls[flow] = min(wall, walls.get(flow, wall))
    delegate_ms = (walls["delegating"] - walls["alone"]) / steps * 1000
    step_ms = (walls["two"] - walls["alone"]) / steps * 1000
    return {
        "steps": steps,
        "delegate_turn_ms": round(delegate_ms, 2),
        "own_step_ms": round(step_ms, 2),
    }


# -- the egress proxy --------------------------------------------------------------------------


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"tide"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None: ...


def proxy_bench(calls: int) -> dict[str, Any]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    proxy = start_proxy([f"127.0.0.1:{server.server_address[1]}"])
    try:
        one_request_s(url)
        one_request_s(url, proxy=proxy)  # warm both paths
        direct = [one_request_s(url) for _ in range(calls)]
        through = [one_request_s(url, proxy=proxy) for _ in range(calls)]
    finally:
        proxy.close()
        server.shutdown()
    extra = _ms(through) - _ms(direct)
    return {
        "direct_request_ms": _ms(direct),
        "proxied_request_ms": _ms(through),
        "proxy_extra_ms": round(extra, 3),
        "proxy_goal_ms": PROXY_GOAL_MS,
    }


def goals(figures: dict[str, Any]) -> list[Goal]:
    m, d, p = figures["mcp"], figures["delegation"], figures["proxy"]
    return [
        Goal("one MCP stdio call (median)", m["mcp_call_ms"], MCP_GOAL_MS, loads=tuple(m["loads"]), unit=" ms"),
        Goal(
            "a delegate turn, against a step of its own",
            d["delegate_turn_ms"],
            d["own_step_ms"],
            loads=tuple(d["loads"]),
            unit=" ms",
        ),
        Goal("one proxied GET (median)", p["proxied_request_ms"], PROXY_GOAL_MS, loads=tuple(p["loads"]), unit=" ms"),
    ]


def table(figures: dict[str, Any], when: str, judged: list[Goal]) -> str:
    m, d, p = figures["mcp"], figures["delegation"], figures["proxy"]
    mcp, delegate, proxy = (g.verdict for g in judged)
    return (
        "## reach — MCP calls, delegate turns and proxied requests against the direct way\n\n"
        f"Machine: {figures['machine']}. Command: `python bench/reach.py --write` ({when}).\n\n"
        "| figure | through laneflow | direct | goal | verdict |\n|---|---|---|---|---|\n"
        f"| one MCP stdio call, after its server started (median of {figures['calls']}) | {m['mcp_call_ms']} ms"
        f" | {m['direct_call_ms']} ms | under {m['mcp_goal_ms']:g} ms | {mcp} |\n"
        f"| the first MCP call (starts the server, lists its tools) | {m['mcp_first_call_ms']} ms | — | none | — |\n"
        f"| one delegate turn on the stub, inside its caller's attempt (over {d['steps']} steps) | {d['delegate_turn_ms']} ms"
        f" | {d['own_step_ms']} ms as a step of its own | less than a step of its own | {delegate} |\n"
        f"| one GET of a local server through the egress proxy (median of {figures['calls']}) | {p['proxied_request_ms']} ms"
        f" | {p['direct_request_ms']} ms | under {p['proxy_goal_ms']:g} ms | {proxy} |\n\n" + goal_table(judged)
    )


def _timed(part: Callable[[int], dict[str, Any]], n: int) -> dict[str, Any]:
    """A part's figures with the loads seen before and after it."""
    before = load()
    figures = part(n)
    return figures | {"loads": [round(before, 2), round(load(), 2)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    figures = {
        "calls": args.calls,
        "mcp": _timed(mcp_bench, args.calls),
        "delegation": _timed(delegation_bench, args.steps),
        "proxy": _timed(proxy_bench, args.calls),
        "machine": machine(),
    }
    judged = goals(figures)
    figures["goals"] = [g.__dict__ | {"verdict": g.verdict} for g in judged]
    if args.json:
        print(json.dumps(figures))
    else:
        print(table(figures, time.strftime("%Y-%m-%d"), judged))
    if args.write:
        write_section(HERE / "RESULTS.md", "reach", table(figures, time.strftime("%Y-%m-%d"), judged))
    return exit_code(judged)


if __name__ == "__main__":
    sys.exit(main())
