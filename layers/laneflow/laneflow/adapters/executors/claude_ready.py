"""A readied sibling's first request: built while its lead is in flight, held at the gate,
and sent as it stands the moment the gate is released.

Through the SDK a request costs 1.2-1.9 ms of client CPU to build (its typed parameters,
options and headers), which a hundred siblings released at once pay one after another on two
cores. So a held request is built before the wait (`ReadyRequest.build`): its JSON body
serialised once, its headers the SDK client's own (`default_headers`: its key, version and
platform headers), as an HTTP request of the client's own httpx client. On release it goes
out with `send`, and its response is read as the SDK reads a stream (`anthropic.Stream` over
the response), so the turn is read exactly as any other. A response that is not a 200 is
closed and the turn is sent again through the SDK, whose errors and retries then apply.

Only a request with no beta header is readied (a beta request takes the SDK's beta path);
only the executor's own client can send one (a client handed in by a test is not its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import anthropic
from anthropic.types import RawMessageStreamEvent

from laneflow.adapters.engine import held
from laneflow.ports import ExecutionSink

MESSAGES_PATH = "/v1/messages"


@dataclass
class ReadyRequest:
    request: Any  # the httpx request, built
    http: Any  # the httpx client that sends it

    @staticmethod
    def build(client: anthropic.Anthropic, http: Any, params: dict[str, Any], timeout: float | None) -> ReadyRequest | None:
        """The turn's request, ready to send; None when it is not one to ready."""
        if http is None or "betas" in params:
            return None
        body = json.dumps({**params, "stream": True}, ensure_ascii=False, separators=(",", ":")).encode()
        url = str(client.base_url).rstrip("/") + MESSAGES_PATH
        headers = {k: v for k, v in client.default_headers.items() if isinstance(v, str)}
        kwargs: dict[str, Any] = {"headers": headers, "content": body}
        if timeout is not None:
            kwargs["timeout"] = timeout
        return ReadyRequest(request=http.build_request("POST", url, **kwargs), http=http)

    def send(self, client: anthropic.Anthropic) -> Any | None:
        """Send it; the response as the SDK's stream of events, or None (not a 200: closed, the
        caller sends the turn through the SDK)."""
        response = self.http.send(self.request, stream=True)
        if response.status_code != 200:
            response.close()
            return None
        return anthropic.Stream(cast_to=cast(Any, RawMessageStreamEvent), response=response, client=client)


def wait_at_gate(gate: str, sink: ExecutionSink) -> None:
    """Hold the request until the gate's lead replies (or ended); a stop meanwhile ends the
    wait, and the caller's stop check ends the attempt."""
    held.wait(gate, sink.stopped)
