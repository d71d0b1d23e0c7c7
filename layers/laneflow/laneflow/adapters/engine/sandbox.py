"""Sandbox workers on one machine: the embedded engine's answer to the definition's sandbox
state (`ecs:runTask.waitForTaskToken`).

The state's container overrides (its task token, its step request) become the environment
of a child process running the sandbox worker's entrypoint
(`python -m laneflow.entrypoints.sandbox_worker`), exactly as a Fargate task would get them.
The child cannot reach the engine's interpreter, which lives in this process, so every
callback it makes (its own heartbeat, success or failure, and a sandboxed lead's release of
its siblings' gate) is relayed: one JSON line per call over a Unix socket the engine listens
on (`LANEFLOW_RELAY`), answered by one line, so a token that is gone reads as `TokenGone`
in the child as it would from Step Functions.

A child that exits without completing its token (a crash, a kill) fails it here with
`SandboxWorkerExited`, which the state's Catch turns into StepCrashed, as for a Lambda that
died. Stopping the engine (`stop_all`) kills every child's process group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from laneflow.ports import TaskCallbacks, TokenGone

log = logging.getLogger("laneflow.sandbox")

WORKER_MODULE = "laneflow.entrypoints.sandbox_worker"

KILL_GRACE_S = 1.0  # between SIGTERM and SIGKILL of a child's process group


# -- the child's side --------------------------------------------------------------------------


class RelayClosed(RuntimeError):
    """The engine's end of the relay closed: the engine process this worker works for is gone
    (a kill -9 of `laneflow run` closes its sockets with it)."""


class RelayCallbacks:
    """`TaskCallbacks` of a worker in another process than the engine's (a local sandbox
    worker, a step worker): each call goes to the engine's relay.

    The relay closing means the worker's engine is gone: no token it completes is waited on
    any more, and its attempt is for reconcile to end (interrupted, its worker gone), never
    for the worker to end failed with "the engine closed the relay". With `on_closed` (the
    worker's way of going away at once, which does not return) the relay is watched from the
    start: a thread hears it close the moment it does, also while nothing is asked, and a
    call that meets it closed calls `on_closed` too, so no code of the worker runs on after
    it. Without, such a call raises `RelayClosed`."""

    def __init__(self, path: str, on_closed: Callable[[], None] | None = None):
        self.path = path
        self.on_closed = on_closed
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._file: Any = None
        if on_closed is not None:
            self._watch()

    def _connect(self) -> socket.socket:
        """The connection to the relay (made once; under the lock)."""
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                raise
            self._sock, self._file = sock, sock.makefile("rwb")
        return self._sock

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            try:
                self._connect()
                self._file.write(json.dumps(message).encode() + b"\n")
                self._file.flush()
                line = self._file.readline()
            except OSError:
                line = b""
        if not line:
            self._closed()
        answer = json.loads(line)
        if "gone" in answer:
            raise TokenGone(answer["gone"])
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer  # type: ignore[no-any-return]

    def _closed(self) -> NoReturn:
        if self.on_closed is not None:
            self.on_closed()
        raise RelayClosed("the engine closed the relay")

    def _watch(self) -> None:
        """Connect now, and hear the connection close on a thread of its own: `poll` for the
        peer's hang-up only (never for data, so the answers stay the callers' to read)."""
        with self._lock:
            try:
                sock = self._connect()
            except OSError:
                sock = None
        if sock is None:
            self._closed()
        hang_up = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR | select.POLLNVAL

        def hear() -> None:
            poller = select.poll()
            poller.register(sock, hang_up)
            while not any(events & hang_up for _, events in poller.poll()):
                pass
            if self.on_closed is not None:
                self.on_closed()

        threading.Thread(target=hear, name="laneflow-relay-watch", daemon=True).start()

    def succeed(self, token: str, output: dict[str, Any]) -> None:
        self._ask({"op": "succeed", "token": token, "output": output})

    def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
        """One call for all of them: the engine completes each (a round trip per token, each
        waiting for the engine's interpreter lock, cost a lead's 99 siblings half a second)."""
        answer = self._ask({"op": "succeed_all", "tokens": list(tokens), "output": output})
        return [str(t) for t in answer.get("gone_all", [])]

    def fail(self, token: str, error: str, cause: str) -> None:
        self._ask({"op": "fail", "token": token, "error": error, "cause": cause})

    def heartbeat(self, token: str) -> None:
        self._ask({"op": "heartbeat", "token": token})


def gone_of(succeed: Callable[[str, dict[str, Any]], None], tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
    """`succeed` each token in turn; the tokens nothing waited on (TokenGone)."""
    gone = []
    for token in tokens:
        try:
            succeed(token, output)
        except TokenGone:
            gone.append(token)
    return gone


# -- the engine's side -------------------------------------------------------------------------


@dataclass
class Child:
    """One sandbox worker: the token it completes, its process (its own process group)."""

    token: str
    pid: int
    exited: threading.Event = field(default_factory=threading.Event)
    code: int | None = None


class Zygote:
    """The warm worker (`sandbox_worker --zygote`): one Python that imported laneflow once
    and forks a sandbox worker per step, so a step does not pay an interpreter's start."""

    def __init__(self, environ: Mapping[str, str], on_exit: Any):
        self.on_exit = on_exit  # (pid, code) of each worker that ended
        self._process = subprocess.Popen(  # our own interpreter and module
            [sys.executable, "-m", WORKER_MODULE, "--zygote"],
            env=dict(environ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self.ready = threading.Event()
        threading.Thread(target=self._read, name="sandbox-zygote", daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            if "exit" in message:
                self.on_exit(int(message["exit"]), int(message["code"]))
            elif "ready" in message:
                self.ready.set()
            else:
                self._answers.put(message)
        self._answers.put({"error": "the warm worker ended"})

    def fork(self, env: Mapping[str, str], timeout_s: float = 30.0) -> int:
        """A new sandbox worker with `env` as its whole environment; its pid."""
        assert self._process.stdin is not None
        with self._lock:
            self._process.stdin.write(json.dumps({"env": dict(env)}).encode() + b"\n")
            self._process.stdin.flush()
            answer = self._answers.get(timeout=timeout_s)
        if "pid" not in answer:
            raise RuntimeError(str(answer.get("error")))
        return int(answer["pid"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(2)
        except subprocess.TimeoutExpired:
            _signal_group(self._process.pid, signal.SIGKILL)
            self._process.wait()


class CallbackRelay:
    """The engine's end of the relay: a Unix socket only this user may reach, on which
    workers in other processes (sandbox workers, step workers) make their callbacks, one JSON
    line per call answered by one line, completed on `callbacks` (the in-process
    interpreter's). `on_reported(token)` hears each token a worker completed."""

    def __init__(self, callbacks: TaskCallbacks, on_reported: Any = None):
        self.callbacks = callbacks
        self.on_reported = on_reported
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self.path = ""  # the socket, made by the first `listen`
        self._server: socket.socket | None = None
        self._closed = False

    def listen(self) -> str:
        """Open the relay (once), in a private folder whose path fits a Unix socket's 108
        bytes (a long TMPDIR falls back to /tmp); its path."""
        with self._lock:
            if self._server is not None:
                return self.path
            base = tempfile.gettempdir()
            self._dir = Path(tempfile.mkdtemp(prefix="laneflow-relay-", dir=base if len(base) <= 60 else "/tmp"))
            self.path = str(self._dir / "relay.sock")
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(self.path)
            os.chmod(self.path, 0o600)
            server.listen(64)
            self._server = server
        threading.Thread(target=self._accept, args=(server,), name="laneflow-relay", daemon=True).start()
        return self.path

    def _accept(self, server: socket.socket) -> None:
        while not self._closed:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="laneflow-relay-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as fh:
            try:
                for line in fh:
                    fh.write(json.dumps(self.answer(json.loads(line))).encode() + b"\n")
                    fh.flush()
            except OSError:  # the worker went away mid-call (killed, or its step stopped)
                return

    def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        token = str(message.get("token", ""))
        try:
            match message.get("op"):
                case "succeed_all":
                    tokens = [str(t) for t in message.get("tokens") or []]
                    gone = set(self.callbacks.succeed_all(tokens, message.get("output") or {}))
                    for each in tokens:
                        if each not in gone and self.on_reported is not None:
                            self.on_reported(each)
                    return {"ok": True, "gone_all": sorted(gone)}
                case "succeed":
                    self.callbacks.succeed(token, message.get("output") or {})
                case "fail":
                    self.callbacks.fail(token, str(message.get("error")), str(message.get("cause") or ""))
                case "heartbeat":
                    self.callbacks.heartbeat(token)
                case other:
                    return {"error": f"unknown relay call {other!r}"}
        except TokenGone as gone:
            return {"gone": str(gone)}
        except Exception as error:  # the worker is told, and decides
            return {"error": f"{type(error).__name__}: {error}"}
        if message.get("op") in ("succeed", "fail") and self.on_reported is not None:
            self.on_reported(token)
        return {"ok": True}

    def close(self) -> None:
        self._closed = True
        if self._server is None or self._dir is None:
            return
        with contextlib.suppress(OSError):
            self._server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            self._dir.rmdir()


class Sandboxes:
    """The engine's sandbox workers: starts one per sandbox state (forked by the warm worker
    when `warm`, else a fresh interpreter), relays their callbacks to `callbacks` (the
    in-process interpreter's), and ends them."""

    def __init__(self, callbacks: TaskCallbacks, environ: Mapping[str, str], *, warm: bool = False):
        self.callbacks = callbacks
        self.environ = dict(environ)  # what every child inherits (the store, the model's settings)
        self.children: dict[str, Child] = {}
        self._by_pid: dict[int, Child] = {}
        self._early_exits: dict[int, int] = {}  # pid -> exit code, of workers not yet registered
        self._reported: set[str] = set()  # the tokens their workers completed
        self._lock = threading.Lock()
        self.relay = CallbackRelay(callbacks, on_reported=self._report)
        self._closed = False
        self.zygote = Zygote(self.environ, self._exited) if warm else None

    @property
    def path(self) -> str:
        """The relay's socket ("" until the first worker starts)."""
        return self.relay.path

    def _report(self, token: str) -> None:
        with self._lock:  # by token: a worker may report before `launch` has registered it
            self._reported.add(token)

    # the children

    def launch(self, env: Mapping[str, str]) -> Child:
        """Start a sandbox worker for one sandbox state, with the state's overrides as its
        environment over the engine's."""
        token = env["LANEFLOW_TASK_TOKEN"]
        self.relay.listen()
        whole = {**self.environ, **env, "LANEFLOW_RELAY": self.path}
        if self.zygote is not None and self.zygote.ready.wait(30):
            pid = self.zygote.fork(whole)
        else:
            process = subprocess.Popen(  # our own interpreter and module
                [sys.executable, "-m", WORKER_MODULE],
                env=whole,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: a stop kills all it started
            )
            pid = process.pid
            threading.Thread(target=lambda: self._exited(process.pid, process.wait()), daemon=True).start()
        child = Child(token=token, pid=pid)
        with self._lock:
            self.children[token] = child
            self._by_pid[pid] = child
            early = self._early_exits.pop(pid, None)  # it ended before it was known here
        if early is not None:
            self._exited(pid, early)
        return child

    def _exited(self, pid: int, code: int) -> None:
        with self._lock:
            child = self._by_pid.pop(pid, None)
            if child is None:
                self._early_exits[pid] = code  # told before `launch` knew its pid
                return
            self.children.pop(child.token, None)
            reported = child.token in self._reported
        child.code = code
        child.exited.set()
        if reported or self._closed:
            return
        try:  # it died without a word: the state catches this as a crashed worker
            self.callbacks.fail(
                child.token, "SandboxWorkerExited", f"the sandbox worker exited with code {code} before it reported"
            )
        except TokenGone:
            pass
        except Exception:  # the interpreter has gone with its drive
            log.debug("could not fail the token of a sandbox worker that exited", exc_info=True)

    def stop_all(self, grace_s: float = KILL_GRACE_S) -> None:
        """End every child's process group: SIGTERM, then SIGKILL after `grace_s`."""
        with self._lock:
            children = list(self.children.values())
        for child in children:
            _signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            if not child.exited.wait(max(0.0, deadline - time.monotonic())):
                _signal_group(child.pid, signal.SIGKILL)
                child.exited.wait(5)

    def close(self) -> None:
        self.stop_all()
        self._closed = True
        if self.zygote is not None:
            self.zygote.close()
        self.relay.close()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
