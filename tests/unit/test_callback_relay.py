"""The callback relay between a worker process and the engine's interpreter: one call
completes many tokens (a lead releasing its lane), and says which were gone; a single
token's gone-ness crosses as TokenGone, as from Step Functions. Through the real socket."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from laneflow.adapters.engine.sandbox import CallbackRelay, RelayCallbacks, gone_of
from laneflow.ports import TokenGone


class Waiting:
    """The interpreter's side: tokens still waiting, and what completed them."""

    def __init__(self, waiting: set[str]) -> None:
        self.completed: list[Any]
        self.waiting, self.completed = waiting, []

    def succeed(self, token: str, output: dict[str, Any]) -> None:
        if token not in self.waiting:
            raise TokenGone(token)
        self.waiting.remove(token)
        self.completed.append((token, output))

    def succeed_all(self, tokens: Sequence[str], output: dict[str, Any]) -> list[str]:
        return gone_of(self.succeed, tokens, output)

    def fail(self, token: str, error: str, cause: str) -> None:
        self.succeed(token, {"error": error})

    def heartbeat(self, token: str) -> None:
        if token not in self.waiting:
            raise TokenGone(token)


def test_one_relay_call_releases_every_waiting_token_and_names_the_gone_ones() -> None:
    engine = Waiting({"a", "b", "d"})
    reported: list[str] = []
    relay = CallbackRelay(engine, on_reported=reported.append)
    try:
        worker = RelayCallbacks(relay.listen())
        gone = worker.succeed_all(["a", "b", "c", "d"], {"released": "the lead's reply began"})
        assert gone == ["c"]
        assert engine.completed == [(t, {"released": "the lead's reply began"}) for t in ("a", "b", "d")]
        assert reported == ["a", "b", "d"]
        assert worker.succeed_all([], {}) == []
        with pytest.raises(TokenGone):
            worker.succeed("a", {})  # completed already
        with pytest.raises(TokenGone):
            worker.heartbeat("zzz")
    finally:
        relay.close()


class Engine:
    """The engine's end of a relay as its process dies: a socket that answers every call
    "ok", and closes everything at once (`die`), as the kernel does for a process killed with
    SIGKILL."""

    def __init__(self, folder: Path) -> None:
        import socket
        import threading

        self.path = str(folder / "relay.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(8)
        self.conns: list[Any] = []
        self.connected = threading.Event()
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.connected.set()
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: Any) -> None:
        with conn.makefile("rwb") as fh:
            try:
                for _ in fh:
                    fh.write(b'{"ok": true}\n')
                    fh.flush()
            except (OSError, ValueError):
                return

    def die(self) -> None:
        import os
        import socket

        for conn in self.conns:
            conn.shutdown(socket.SHUT_RDWR)
        self.server.shutdown(socket.SHUT_RDWR)  # wakes its accept
        self.server.close()
        self.accepting.join(5)
        os.unlink(self.path)


def test_a_worker_hears_its_engine_go_at_once_while_nothing_is_asked(tmp_path: Path) -> None:
    import threading
    import time

    engine = Engine(tmp_path)
    gone = threading.Event()
    RelayCallbacks(engine.path, on_closed=gone.set)
    assert engine.connected.wait(5)  # connected from the start, to hear it close
    time.sleep(0.1)
    assert not gone.is_set()
    engine.die()
    assert gone.wait(2)


def test_a_call_that_meets_a_closed_relay_is_the_engine_gone_never_an_ordinary_error(tmp_path: Path) -> None:
    from laneflow.adapters.engine.sandbox import RelayClosed

    engine = Engine(tmp_path)
    worker = RelayCallbacks(engine.path)  # nobody told to leave: the call says so by its own type
    worker.heartbeat("t")  # connected, answered
    engine.die()
    with pytest.raises(RelayClosed, match="the engine closed the relay"):
        worker.heartbeat("t")
    told: list[str] = []
    with pytest.raises(RelayClosed):  # no engine to connect to: gone from the start (and told so)
        RelayCallbacks(str(tmp_path / "no-engine-here.sock"), on_closed=lambda: told.append("gone"))
    assert told == ["gone"]
