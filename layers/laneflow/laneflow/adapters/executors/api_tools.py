"""The API tools of one step (agent.md `apis:`, `domain/apis.py`): the HTTP call behind
`api_<name>`, made the same way for the Claude executor, the stub's `tool:` lines and in a
sandbox worker (they all run a step's tools through `StepTools`).

- The call reaches only its API's scheme, host and port, under its base path: a path that
  escapes, an absolute URL to another host and a redirect to another host are refused. No
  proxy from the environment is used (a proxy would see the filled-in headers).
- Each header naming a secret as `${NAME}` is filled from the attempt's loaded secrets at
  call time. What is recorded (the tool event, the capture, the span) is the call's input
  and the report below, which names the headers sent, never their values; a value the
  server echoes back is masked by the store's redactor like every loaded secret.
- The report is the status, a few response headers and the body, cut at MAX_RESPONSE_CHARS
  saying so. A refused URL, a timeout (the call's own, bounded by what is left of the
  step's `timeout:`), a connection failure and a 4xx or 5xx status are `ToolError`s: an
  `is_error` result for the model.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import Message
from http.client import HTTPMessage
from typing import Any

from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.apis import ApiSpec, CallInvalid, fill_headers, parse_call, target_url, within
from laneflow.domain.errors import StepStopped
from laneflow.domain.secrets import DeclaredSecret

MAX_RESPONSE_CHARS = 30_000

MAX_READ_BYTES = 4 * MAX_RESPONSE_CHARS + 1_000_000  # read no further: the report says "more than"

DEFAULT_API_TIMEOUT_S = 60.0

MAX_REDIRECTS = 5

STOP_POLL_S = 0.05  # how often a call in flight looks for a stop

SHOWN_HEADERS = ("content-type", "content-length", "location", "retry-after", "etag", "last-modified", "link")


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the API's own base URL; refuses any other."""

    max_redirections = MAX_REDIRECTS

    def __init__(self, base_url: str):
        self.base_url = base_url

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        why = within(self.base_url, newurl)
        if why:
            raise ToolError(f"refused: the server redirected ({code}) to {newurl.split('?')[0]}, and {why}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _secret_values(spec: ApiSpec, secret_env: dict[str, str]) -> dict[str, str]:
    """NAME -> value for the secrets the API's headers name, from the attempt's loaded ones
    (kept under the name each crosses as)."""
    values = {}
    for name in spec.secret_names:
        crossed = DeclaredSecret(name=name, as_file=False).env_name
        if crossed not in secret_env:
            raise ToolError(f"secret {name} is not loaded for this step; declare it in the agent's secrets:")
        values[name] = secret_env[crossed]
    return values


def _report(status: int, reason: str, headers: Message, body: bytes, more: bool, sent: list[str]) -> str:
    charset = headers.get_content_charset() or "utf-8"
    try:
        text = body.decode(charset, "replace")
    except LookupError:  # a charset Python does not know
        text = body.decode("utf-8", "replace")
    total = f"more than {len(text):,}" if more else f"{len(text):,}"
    if more or len(text) > MAX_RESPONSE_CHARS:
        text = text[:MAX_RESPONSE_CHARS] + f"\n[body cut at {MAX_RESPONSE_CHARS:,} of {total} characters]"
    shown = [f"{name}: {headers[name]}" for name in SHOWN_HEADERS if headers.get(name)]
    lines = [f"HTTP {status} {reason}".rstrip(), *shown]
    if sent:
        lines.append(f"(sent the headers {', '.join(sent)})")
    return "\n".join(lines) + "\n--- body ---\n" + text


def _read(response: Any) -> tuple[bytes, bool]:
    body = response.read(MAX_READ_BYTES + 1)
    return body[:MAX_READ_BYTES], len(body) > MAX_READ_BYTES


class ApiTools:
    """A step's API tools, by tool name (`api_<name>`)."""

    def __init__(self, apis: tuple[ApiSpec, ...] | list[ApiSpec], secret_env: dict[str, str]):
        self.apis = {spec.tool_name: spec for spec in apis}
        self.secret_env = secret_env

    @property
    def names(self) -> list[str]:
        return sorted(self.apis)

    def describe(self) -> str:
        """One trace line: each tool, where it reaches, the headers it sends (names only)."""
        parts = [
            f"{name} reaches {spec.base_url}" + (f" sending {', '.join(sorted(spec.headers))}" if spec.headers else "")
            for name, spec in sorted(self.apis.items())
        ]
        return "API tools: " + "; ".join(parts)

    def definitions(self) -> list[dict[str, Any]]:
        defs = []
        for name, spec in sorted(self.apis.items()):
            listed = "; its operations are listed in your instructions" if spec.operations else ""
            defs.append(
                {
                    "name": name,
                    "description": (
                        f"Call the HTTP API at {spec.base_url} (only that host){listed}. "
                        f"Returns the status, a few headers and the body (cut at {MAX_RESPONSE_CHARS:,} characters); "
                        "a 4xx or 5xx status is an error."
                    ),
                    "input_schema": {
                        "type": "object",
                        "properties": {
                            "method": {"type": "string", "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]},
                            "path": {"type": "string", "description": "relative to the base URL, such as /items/42"},
                            "query": {"type": "object", "description": "query parameters"},
                            "body": {"description": "JSON to send (a string is sent as text)"},
                        },
                        "required": ["path"],
                    },
                }
            )
        return defs

    def run(self, name: str, args: Any, *, timeout_s: float, stopped: Callable[[], bool]) -> str:
        """Make one call; its own failure (refused, timed out, 4xx/5xx) is a `ToolError`."""
        spec = self.apis[name]
        try:
            call = parse_call(args)
            url = target_url(spec.base_url, call)
        except CallInvalid as e:
            raise ToolError(f"{name}: {e}") from None
        headers = fill_headers(spec, _secret_values(spec, self.secret_env))
        if call.content_type:
            headers.setdefault("Content-Type", call.content_type)
        request = urllib.request.Request(url, data=call.body, headers=headers, method=call.method)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _Redirects(spec.base_url))
        exchange = _Exchange(
            name, opener, request, timeout_s, sent=sorted(spec.headers), where=f"{call.method} {url.split('?')[0]}"
        )
        # The call runs on its own thread, so a stop ends the attempt at once (the abandoned
        # call ends by its own timeout; nothing reads what it gets).
        worker = threading.Thread(target=exchange, name=f"laneflow-{name}", daemon=True)
        started = time.monotonic()
        worker.start()
        while worker.is_alive():
            worker.join(STOP_POLL_S)
            if stopped():
                raise StepStopped(f"stopped by a person (during its {name} call, after {time.monotonic() - started:.1f} s)")
        if exchange.error is not None:
            raise exchange.error
        return exchange.report


class _Exchange:
    """One request and its report, or the `ToolError` saying how it failed."""

    def __init__(
        self,
        name: str,
        opener: urllib.request.OpenerDirector,
        request: urllib.request.Request,
        timeout_s: float,
        *,
        sent: list[str],
        where: str,
    ):
        self.name, self.opener, self.request, self.timeout_s, self.sent, self.where = (
            name,
            opener,
            request,
            timeout_s,
            sent,
            where,
        )
        self.report = ""
        self.error: ToolError | None = None

    def __call__(self) -> None:
        try:
            self.report = self._exchange()
        except ToolError as error:
            self.error = error
        except Exception as error:  # whatever the call met is the tool's own failure
            self.error = ToolError(f"{self.name}: the call failed ({type(error).__name__}: {error})")

    def _exchange(self) -> str:
        name, sent, where = self.name, self.sent, self.where
        try:
            with self.opener.open(self.request, timeout=self.timeout_s) as response:
                body, more = _read(response)
                return _report(response.status, response.reason, response.headers, body, more, sent)
        except urllib.error.HTTPError as e:
            body, more = _read(e)
            raise ToolError(
                f"{name}: the API answered {e.code}\n" + _report(e.code, str(e.reason or ""), e.headers, body, more, sent)
            ) from None
        except (TimeoutError, urllib.error.URLError) as e:
            if isinstance(e, TimeoutError) or isinstance(e.reason, TimeoutError):
                raise ToolError(f"{name}: no answer within {self.timeout_s:.1f} s ({where}); the call was given up") from None
            raise ToolError(f"{name}: could not reach {where} ({e.reason})") from None
        except (OSError, ValueError) as e:  # a reset connection, a malformed answer
            raise ToolError(f"{name}: the call failed ({type(e).__name__}: {e})") from None
