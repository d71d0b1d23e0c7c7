"""The callback relay between a worker process and the engine's interpreter: one call
completes many tokens (a lead releasing its lane), and says which were gone; a single
token's gone-ness crosses as TokenGone, as from Step Functions. Through the real socket."""

from __future__ import annotations

import pytest

from laneflow.adapters.engine.sandbox import CallbackRelay, RelayCallbacks, gone_of
from laneflow.ports import TokenGone


class Waiting:
    """The interpreter's side: tokens still waiting, and what completed them."""

    def __init__(self, waiting: set[str]):
        self.waiting, self.completed = waiting, []

    def succeed(self, token, output):
        if token not in self.waiting:
            raise TokenGone(token)
        self.waiting.remove(token)
        self.completed.append((token, output))

    def succeed_all(self, tokens, output):
        return gone_of(self.succeed, tokens, output)

    def fail(self, token, error, cause):
        self.succeed(token, {"error": error})

    def heartbeat(self, token):
        if token not in self.waiting:
            raise TokenGone(token)


def test_one_relay_call_releases_every_waiting_token_and_names_the_gone_ones():
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
