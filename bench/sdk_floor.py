"""The floor under a gated fan-out's sibling starts: the same requests through the SDK alone.

When a lane's gate opens, each of its N - 1 siblings sends one Messages API request through
the anthropic SDK. This sends those requests with nothing else running: no engine, no store,
no prompt building, only the SDK and the imitation. `processes` client processes stand for
the step workers, each with its share of the requests on threads of its own; their
connections are opened first (one warm burst, as a worker's pool has them after a run),
then every thread sends at one instant. It reports, in ms after that instant, when the
median and the last request had been written whole (the transport's own trace of the
request body sent), and the CPU the clients spent until their last one was sent (and the imitation's over the
burst, to the streams' ends).
What laneflow's sibling starts measure above this floor is the engine's and laneflow's own.
Beside it, the raw floor: the same requests written as prebuilt HTTP/1.1 bytes on sockets
opened before the instant (nothing of the SDK). Each client says when it was ready (its
client built, its warm burst over, its sockets open); a burst whose clients were not all
ready before the instant is marked so, since it measured their start instead.

    python bench/sdk_floor.py --n 99 --processes 2 --repeat 3 [--json]

(With no `--params FILE`, the request is the warm_gate benchmark's, captured from one step.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WARM_S = 2.0  # the warm burst goes this long before the measured one
LEAD_S = 4.0  # children start, import and connect within this


def process_cpu_ms(pid: int) -> float:
    """User and system CPU of a process so far, ms (Linux /proc; dead threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _traced_client(url: str, key: str, share: int, sent: list[float], cpu: dict[str, float]) -> Any:
    """The SDK's client, its transport noting when each request body was written whole (and
    this process's CPU when its `share`-th was)."""
    import anthropic

    try:
        import httpx2 as http
    except ImportError:  # pragma: no cover
        import httpx as http  # type: ignore[no-redef]

    class Traced(http.HTTPTransport):
        def handle_request(self, request: Any) -> Any:
            def trace(name: str, info: Any) -> None:
                if name == "http11.send_request_body.complete":
                    sent.append(time.time())
                    if len(sent) == share:
                        cpu["last_sent"] = time.process_time()

            request.extensions["trace"] = trace
            return super().handle_request(request)

    # The SDK's own pool limits (a transport given to it keeps httpx's smaller default).
    limits = http.Limits(max_connections=1000, max_keepalive_connections=100)
    return anthropic.Anthropic(
        api_key=key, base_url=url, max_retries=0, http_client=anthropic.DefaultHttpxClient(transport=Traced(limits=limits))
    )


def _raw_child(url: str, key: str, params: dict[str, Any], share: int, at: float) -> None:
    """The raw floor: `share` threads write the same requests as prebuilt HTTP/1.1 bytes on
    connections opened before `at`, at that instant; nothing of the SDK runs."""
    host, port = url.removeprefix("http://").split(":")
    cpu: dict[str, float] = {}
    sent: list[float] = []
    lock = threading.Lock()

    def request(i: int) -> bytes:
        body = json.dumps(dict(params, stream=True, messages=[{"role": "user", "content": f"Analyse item-{i}."}])).encode()
        head = (
            f"POST /v1/messages HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"x-api-key: {key}\r\nanthropic-version: 2023-06-01\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    wires = [request(i) for i in range(share)]
    socks = [socket.create_connection((host, int(port))) for _ in range(share)]
    ready_at = time.time()

    def send(sock: socket.socket, wire: bytes) -> None:
        time.sleep(max(0.0, at - time.time()))
        sock.sendall(wire)
        with lock:
            sent.append(time.time())
            if len(sent) == share:
                cpu["last_sent"] = time.process_time()
        while sock.recv(65536):  # the stream, to its end (the imitation closes it)
            pass
        sock.close()

    threads = [threading.Thread(target=send, args=pair) for pair in zip(socks, wires, strict=True)]
    for t in threads:
        t.start()
    cpu["before"] = time.process_time()
    for t in threads:
        t.join()
    print(json.dumps({"sent": sent, "cpu_ms": (cpu["last_sent"] - cpu["before"]) * 1000, "ready_at": ready_at}))


def _child(url: str, key: str, params_file: str, share: int, at: float, raw: bool = False) -> None:
    """One client process: `share` threads send the request at `at` (epoch seconds), after a
    warm burst; prints the epoch times their request bodies were written, its CPU, and when
    it was ready (its clients built and its warm burst over: after `at`, the burst measured
    its start, not the SDK's requests)."""
    params = json.loads(Path(params_file).read_text())
    if raw:
        _raw_child(url, key, params, share, at)
        return
    sent: list[float] = []
    cpu: dict[str, float] = {}
    client = _traced_client(url, key, share, sent, cpu)

    def send(i: int, when: float) -> None:
        own = dict(params, messages=[{"role": "user", "content": f"Analyse item-{i}."}])
        time.sleep(max(0.0, when - time.time()))
        with client.messages.create(**own, stream=True) as stream:
            for _ in stream:
                pass

    for when in (at - WARM_S, at):
        threads = [threading.Thread(target=send, args=(i, when)) for i in range(share)]
        for t in threads:
            t.start()
        if when == at:
            cpu["before"] = time.process_time()  # the threads wait for the instant, sleeping
        for t in threads:
            t.join()
        if when != at:
            sent.clear()
            cpu["ready_at"] = time.time()
    print(json.dumps({"sent": sent, "cpu_ms": (cpu["last_sent"] - cpu["before"]) * 1000, "ready_at": cpu["ready_at"]}))


def measure(api: Any, params: dict[str, Any], n: int, processes: int, repeat: int = 3, raw: bool = False) -> dict[str, Any]:
    """`repeat` bursts of `n` requests to the imitation `api` (warm_gate's `RemoteImitation`)
    from `processes` client processes (see the module's docstring): per burst, the median and
    last request written, ms after the instant, and whether every client was ready before it
    (a burst whose clients were not is no floor: `ready` false). With `raw`, prebuilt bytes
    on open sockets instead of the SDK."""
    processes = max(1, processes)
    bursts = []
    with tempfile.TemporaryDirectory() as tmp:
        params_file = Path(tmp) / "params.json"
        params_file.write_text(json.dumps(params))
        for _ in range(repeat):
            at = time.time() + LEAD_S + WARM_S
            shares = [n // processes + (1 if k < n % processes else 0) for k in range(processes)]
            children = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        api.url,
                        api.key,
                        str(params_file),
                        str(share),
                        repr(at),
                        "raw" if raw else "sdk",
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for share in shares
            ]
            time.sleep(max(0.0, at - time.time()))
            imitation_before = process_cpu_ms(api.proc.pid)
            outs = [json.loads(c.communicate()[0]) for c in children]
            imitation_ms = process_cpu_ms(api.proc.pid) - imitation_before  # to the streams' ends
            sent = sorted(t for out in outs for t in out["sent"])
            if len(sent) != n:
                raise RuntimeError(f"{len(sent)} of {n} requests were sent")
            bursts.append(
                {
                    "median_ms": round((statistics.median(sent) - at) * 1000, 1),
                    "last_ms": round((sent[-1] - at) * 1000, 1),
                    "client_cpu_ms": round(sum(out["cpu_ms"] for out in outs), 1),
                    "imitation_cpu_ms": round(imitation_ms, 1),
                    "ready": all(out["ready_at"] <= at for out in outs),
                    "ready_ms_before": round(min(at - out["ready_at"] for out in outs) * 1000, 1),
                }
            )
    return {"n": n, "processes": processes, "raw": raw, "bursts": bursts}


def warm_gate_request() -> dict[str, Any]:
    """The request one step of the warm_gate benchmark's fan-out sends (its lead's first
    turn), captured from one gated run of two steps in this process."""
    sys.path.insert(0, str(HERE))
    import warm_gate as wg

    from laneflow.adapters.executors.anthropic import AnthropicExecutor
    from laneflow.wiring import local_engine

    sent: list[dict[str, Any]] = []

    class Capturing(AnthropicExecutor):
        def _create(self, params: dict[str, Any], timeout: float | None) -> Any:
            sent.append(json.loads(json.dumps(params)))
            return super()._create(params, timeout)

    with tempfile.TemporaryDirectory() as tmp, wg.RemoteImitation(ttft_ms=0, token_ms=0) as api:
        root = Path(tmp)
        svc = wg.services(root, api, step_workers=0, executor=Capturing)  # in this process, to capture it
        wg.one_run(svc, local_engine(svc), api, wg.make_workspace(root), 2, True)
    return sent[0]


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        url, key, params_file, share, at, mode = sys.argv[2:8]
        _child(url, key, params_file, int(share), float(at), raw=mode == "raw")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=99, help="requests in a burst (a fan-out of N has N - 1 siblings)")
    parser.add_argument("--processes", type=int, default=2, help="client processes (the step workers)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--params", help="a JSON file of the request's parameters (default: the warm_gate benchmark's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import warm_gate as wg

    params = json.loads(Path(args.params).read_text()) if args.params else warm_gate_request()
    with wg.RemoteImitation(ttft_ms=wg.TTFT_MS, token_ms=1) as api:
        result = measure(api, params, args.n, args.processes, args.repeat)
        result["raw_floor"] = measure(api, params, args.n, args.processes, args.repeat, raw=True)
    if args.json:
        print(json.dumps(result))
    else:
        for k, b in enumerate(result["raw_floor"]["bursts"], 1):
            print(f"raw burst {k}: last written at {b['last_ms']} ms (ready: {b['ready']})")
        for k, b in enumerate(result["bursts"], 1):
            print(
                f"burst {k}: {args.n} requests from {args.processes} process(es): median sent at {b['median_ms']} ms, last at {b['last_ms']} ms;"
                f" CPU: clients {b['client_cpu_ms']} ms, imitation {b['imitation_cpu_ms']} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
