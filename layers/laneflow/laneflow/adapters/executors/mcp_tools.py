"""The MCP tools of one attempt (agent.md or AGENTS.md `mcp:`, `domain/mcp.py`): each server's
tools as `mcp__<server>__<tool>`, called with the official `mcp` SDK, the same way for the
Claude executor, the stub's `tool:` lines and in a sandbox worker (all run a step's tools
through `StepTools`).

- Sessions live for the attempt. The servers are started, and their tools listed, once,
  when the tool definitions are first needed (so the definitions are the same at every
  turn: they are part of the cached prefix); `close` ends them with the attempt. At most
  MAX_TOOLS of a server's tools are given (by name), the trace saying how many it has.
- The SDK is async: one event loop runs on a thread of the attempt's own, and each call is
  submitted to it and waited for here, a stop (`sink.stopped()`) ending the wait at once.
- A stdio server of a sandboxed step runs inside that step's sandbox, wrapped the way its
  programs are (`fenced`: the isolation's own bubblewrap arguments, the sandbox's uid, the
  size's limits, the step's program environment); outside a sandbox it is a plain child
  process with only its listed env and PATH, HOME, LANG and TZ (`plain`). Either way it is
  started by this module's own pipe transport, since the SDK's stdio client adds the host's
  own variables (USER, SHELL, ...) to every server's environment and can set no uid or limit.
- An HTTP server is reached by this process, with no proxy from the environment (a proxy
  would see the filled-in headers).
- Each `${NAME}` of a server's env or headers is filled from the attempt's loaded secrets
  when it is started; what is recorded (the tool event, the capture) is the call's input and
  the result, masked by the store's redactor like every loaded secret.
- A server that fails to start, to list or to answer within the step's `timeout:` (what is
  left of it, else DEFAULT_MCP_TIMEOUT_S), and a tool answering `isError`, are `ToolError`s:
  an `is_error` result, and the step goes on. A result is cut at MAX_RESULT_CHARS saying so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from laneflow.adapters.executors.bubblewrap import bwrap_argv
from laneflow.adapters.executors.isolation import BUBBLEWRAP, Isolation, Limits
from laneflow.adapters.executors.limits import child_setup
from laneflow.adapters.executors.sandbox_user import end_leftovers, hand_over, own_processes, sandbox_uid
from laneflow.adapters.executors.tools import ToolError
from laneflow.domain.entries import fill_secrets
from laneflow.domain.errors import StepStopped
from laneflow.domain.mcp import McpServer, tool_name
from laneflow.domain.records import EventType
from laneflow.domain.secrets import DeclaredSecret
from laneflow.ports import ExecutionSink

if TYPE_CHECKING:  # the SDK is imported when a server is started: a step with none never loads it (~0.45 s of CPU)
    import mcp_types
    from mcp import Client
    from mcp.client import Transport

MAX_RESULT_CHARS = 30_000

DEFAULT_MCP_TIMEOUT_S = 60.0

STOP_POLL_S = 0.05  # how often a call in flight looks for a stop

EXIT_GRACE_S = 2.0  # a stdio server's time to end once its stdin closes, before it is killed

CLOSE_WAIT_S = 10.0  # the most `close` waits for every session to end

MAX_LINE_BYTES = 16 * 1024 * 1024  # the longest message line a stdio server may write

MAX_PAGES = 100  # a server's tool listing, page by page, read no further

MAX_TOOLS = 200  # a server's tools given to the model (by name); the trace says how many more it has

STDERR_TAIL = 1_000  # what a stdio server last wrote on stderr, told when it fails to start

MAX_DESCRIPTION = 4_000

_T = TypeVar("_T")


@dataclass(frozen=True)
class Launch:
    """How a stdio server's program is started: its argv (wrapped by the isolation), its whole
    environment and folder, the uid it runs as and what the child runs before it (the limits),
    and what runs once it has ended (`after`)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    user: int | None = None
    preexec: Callable[[], None] | None = None
    after: Callable[[], None] | None = None


def fenced(
    argv: list[str],
    env: Mapping[str, str],
    *,
    isolation: Isolation,
    scratch: Path,
    base_env: Mapping[str, str],
    limits: Limits,
    read_only: list[Path],
    readable: list[Path],
) -> Launch:
    """A sandboxed step's stdio server: wrapped as its programs are (`programs.run_program`)."""
    uid = sandbox_uid()
    if uid is not None:
        hand_over(scratch, uid, readable)
        processes = limits.processes
    else:  # RLIMIT_NPROC counts the user's own processes too
        processes = limits.processes + (own_processes(os.geteuid()) if os.geteuid() != 0 else 0)
    command = bwrap_argv(argv, scratch, read_only + readable) if isolation is BUBBLEWRAP else argv
    after = (lambda: end_leftovers(uid)) if uid is not None and isolation is not BUBBLEWRAP else None
    return Launch(
        argv=command,
        env={**base_env, **env},
        cwd=str(scratch),
        user=uid,
        preexec=child_setup(limits, processes),
        after=after,
    )


def plain(argv: list[str], env: Mapping[str, str], *, folder: Path | None, lang: str, tz: str) -> Launch:
    """A stdio server of a step that is not sandboxed: a plain child process with only its
    listed env and PATH, HOME, LANG and TZ."""
    where = str(folder) if folder is not None else tempfile.gettempdir()
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": where, "LANG": lang, "TZ": tz}
    return Launch(argv=list(argv), env={**base, **env}, cwd=where)


Launcher = Callable[[list[str], dict[str, str]], Launch]


def _why(exc: BaseException) -> str:
    """An exception in words: the first leaf of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --------------------------------------------------------------------------- transports


class _Tail:
    """The last STDERR_TAIL characters a stdio server wrote on stderr."""

    def __init__(self) -> None:
        self.text = ""

    def add(self, chunk: bytes) -> None:
        self.text = (self.text + chunk.decode("utf-8", "replace"))[-STDERR_TAIL:]


async def _stop(proc: asyncio.subprocess.Process, launch: Launch, tail: _Tail) -> None:
    """End a stdio server: its stdin closed, a grace period, then its whole group killed; what
    it last wrote on stderr kept in `tail` (read before its failure is told)."""
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    try:
        await asyncio.wait_for(proc.wait(), EXIT_GRACE_S)
    except TimeoutError:
        pass
    try:  # what is still running in its group (a child it left behind) goes too
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        await asyncio.wait_for(proc.wait(), EXIT_GRACE_S)
    except TimeoutError:
        pass
    if launch.after is not None:
        await asyncio.to_thread(launch.after)
    if proc.stderr is not None:
        try:
            tail.add(await asyncio.wait_for(proc.stderr.read(65_536), EXIT_GRACE_S / 4))
        except (TimeoutError, OSError, ValueError):
            pass


@asynccontextmanager
async def _stdio(launch: Launch, tail: _Tail) -> AsyncIterator[Any]:
    """A stdio server as the SDK's streams: newline-delimited JSON-RPC on its pipes."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    proc = await asyncio.create_subprocess_exec(
        *launch.argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=launch.env,
        cwd=launch.cwd,
        start_new_session=True,  # its own process group: killed as one
        preexec_fn=launch.preexec,
        user=launch.user,
        group=launch.user,
        extra_groups=[] if launch.user is not None else None,
        close_fds=True,
        limit=MAX_LINE_BYTES,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        async with read_writer:
            while True:
                try:
                    line = await stdout.readline()
                except (ValueError, OSError) as exc:  # a line past MAX_LINE_BYTES, a broken pipe
                    await read_writer.send(exc)
                    return
                if not line:
                    return
                if not line.strip():
                    continue
                try:
                    message: SessionMessage | Exception = SessionMessage(
                        mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    )
                except ValueError as exc:
                    message = exc
                await read_writer.send(message)

    async def write() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    stdin.write((text + "\n").encode("utf-8"))
                    await stdin.drain()
        except (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            await read_writer.aclose()  # the server is gone: the session hears the end

    async def errors() -> None:
        while chunk := await stderr.read(65_536):
            tail.add(chunk)

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read)
            tasks.start_soon(write)
            tasks.start_soon(errors)
            try:
                yield read_stream, write_stream
            finally:
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(proc, launch, tail)


@asynccontextmanager
async def _http(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """An HTTP server as the SDK's streams, its headers sent with every request, no proxy."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(30.0, read=300.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, trust_env=False) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            yield streams


# --------------------------------------------------------------------------- sessions


@dataclass
class _Session:
    """One server of the attempt: its tools once listed, or why it has none."""

    spec: McpServer
    client: Client | None = None
    tools: list[mcp_types.Tool] = field(default_factory=list)
    error: str | None = None
    tail: _Tail = field(default_factory=_Tail)
    closing: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None


class McpTools:
    """An attempt's MCP servers and their tools, by tool name (`mcp__<server>__<tool>`)."""

    def __init__(
        self,
        servers: tuple[McpServer, ...] | list[McpServer],
        secret_env: dict[str, str],
        sink: ExecutionSink,
        *,
        launcher: Launcher,
        deadline: float | None,
    ):
        self.servers = list(servers)
        self.secret_env, self.sink, self.launcher, self.deadline = secret_env, sink, launcher, deadline
        self._sessions: list[_Session] = []
        self._tools: dict[str, tuple[_Session, mcp_types.Tool]] = {}
        self._listed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- the loop ------------------------------------------------------------------------

    def _limit(self) -> float:
        """A wait's time limit: what is left of the step's `timeout:`, else the default."""
        if self.deadline is None:
            return DEFAULT_MCP_TIMEOUT_S
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ToolError("the step's timeout is spent; no more calls can be made")
        return left

    def _start_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="laneflow-mcp", daemon=True)
            self._thread.start()
            self._loop = loop
        return self._loop

    def _wait(self, coro: Coroutine[Any, Any, _T], timeout_s: float, what: str) -> _T:
        """Run `coro` on the loop and wait for it, up to `timeout_s` or a stop."""
        future = asyncio.run_coroutine_threadsafe(coro, self._start_loop())
        started = time.monotonic()
        while True:
            try:
                return future.result(timeout=STOP_POLL_S)
            except concurrent.futures.TimeoutError:
                if self.sink.stopped():
                    future.cancel()
                    raise StepStopped(f"stopped by a person (during {what}, after {time.monotonic() - started:.1f} s)") from None
                if time.monotonic() - started >= timeout_s:
                    future.cancel()
                    raise TimeoutError(f"no answer within {timeout_s:.1f} s") from None

    # -- starting and listing ------------------------------------------------------------

    def _transport(self, session: _Session) -> Transport:
        spec = session.spec
        values = self._secret_values(spec)
        if spec.url is not None:
            return cast("Transport", _http(spec.url, fill_secrets(spec.headers, values)))
        assert spec.command is not None
        launch = self.launcher([spec.command, *spec.args], fill_secrets(spec.env, values))
        return cast("Transport", _stdio(launch, session.tail))

    def _secret_values(self, spec: McpServer) -> dict[str, str]:
        values = {}
        for name in spec.secret_names:
            crossed = DeclaredSecret(name=name, as_file=False).env_name
            if crossed not in self.secret_env:
                raise ToolError(f"secret {name} is not loaded for this step; declare it in the agent's secrets:")
            values[name] = self.secret_env[crossed]
        return values

    async def _hold(self, session: _Session, ready: asyncio.Future[None]) -> None:
        """Open one session, list its tools, and keep it open until the attempt closes it."""
        from mcp import Client

        session.closing = asyncio.Event()
        try:
            async with Client(self._transport(session), cache=None) as client:
                tools: list[mcp_types.Tool] = []
                cursor: str | None = None
                for _ in range(MAX_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    tools += page.tools
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                session.client, session.tools = client, tools
                ready.set_result(None)
                await session.closing.wait()
        except Exception as exc:  # whatever the server met is its own failure, told to the model
            if not ready.done():
                ready.set_exception(exc)
            else:
                session.error = f"ended its session ({_why(exc)})"
        finally:
            session.client = None

    async def _open(self, session: _Session, timeout_s: float) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session.task = asyncio.ensure_future(self._hold(session, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout_s)
        except TimeoutError:
            session.error = f"did not start and list its tools within {timeout_s:.1f} s"
            session.task.cancel()
        except ToolError as exc:
            session.error = f"cannot start: {exc}"
        except Exception as exc:
            told = f"; its stderr ends: {session.tail.text.strip()[-STDERR_TAIL:]}" if session.tail.text.strip() else ""
            session.error = f"could not start or list its tools ({_why(exc)}){told}"

    async def _open_all(self, timeout_s: float) -> None:
        await asyncio.gather(*(self._open(session, timeout_s) for session in self._sessions))

    def listed(self) -> None:
        """Start every server and list its tools, once per attempt."""
        with self._lock:
            if self._listed or not self.servers:
                self._listed = True
                return
            self._listed = True
            self._sessions = [_Session(spec) for spec in self.servers]
            try:
                timeout = self._limit()
            except ToolError as spent:
                for session in self._sessions:
                    session.error = f"was not started: {spent}"
            else:
                self._open_every(timeout)
            for session in self._sessions:
                for tool in sorted(session.tools, key=lambda t: t.name)[:MAX_TOOLS]:
                    self._tools.setdefault(tool_name(session.spec.name, tool.name), (session, tool))
            self._report()

    def _open_every(self, timeout: float) -> None:
        try:  # each server is bounded by the same limit inside; this wait is the backstop
            self._wait(self._open_all(timeout), timeout + EXIT_GRACE_S, "starting its MCP servers")
        except TimeoutError:
            for session in self._sessions:
                session.error = session.error or f"did not start and list its tools within {timeout:.1f} s"

    def _report(self) -> None:
        parts: list[str] = []
        counts: dict[str, int | None] = {}
        for session in self._sessions:
            name = session.spec.name
            if session.error is not None:
                counts[name] = None
                parts.append(f"{name} ({session.spec.where()}) has no tools: it {session.error}")
                self.sink.event(EventType.warning, f"MCP server {name} {session.error}; its tools answer an error")
            else:
                counts[name] = sum(1 for s, _ in self._tools.values() if s is session)
                more = f" (of {len(session.tools)}: at most {MAX_TOOLS} are given)" if len(session.tools) > MAX_TOOLS else ""
                parts.append(f"{name} ({session.spec.where()}): {counts[name]} tools{more}")
        self.sink.event(EventType.info, "MCP servers: " + "; ".join(parts), {"mcp": counts})

    # -- the tools -----------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        self.listed()
        return sorted(self._tools)

    def owns(self, name: str) -> bool:
        """Whether `name` is one of this attempt's servers' tools (listed or not)."""
        return self._server_of(name) is not None

    def _server_of(self, name: str) -> McpServer | None:
        matching = [spec for spec in self.servers if name.startswith(spec.prefix)]
        return max(matching, key=lambda spec: len(spec.prefix)) if matching else None

    def definitions(self) -> list[dict[str, Any]]:
        self.listed()
        defs = []
        for name, (session, tool) in sorted(self._tools.items()):
            described = (tool.description or "").strip()[:MAX_DESCRIPTION]
            schema = dict(tool.input_schema) if isinstance(tool.input_schema, dict) else {}
            schema.setdefault("type", "object")
            defs.append(
                {
                    "name": name,
                    "description": described or f"The tool {tool.name} of the MCP server {session.spec.name}.",
                    "input_schema": schema,
                }
            )
        return defs

    def run(self, name: str, args: dict[str, Any]) -> str:
        """Call one tool; a server that cannot answer, and an error result, are a `ToolError`."""
        self.listed()
        found = self._tools.get(name)
        if found is None:
            spec = self._server_of(name)
            session = next((s for s in self._sessions if spec is not None and s.spec is spec), None)
            if session is not None and session.error is not None:
                raise ToolError(f"{name}: the MCP server {session.spec.name} {session.error}")
            tools = ", ".join(n for n in sorted(self._tools) if spec is not None and n.startswith(spec.prefix)) or "none"
            raise ToolError(f"{name}: no such tool; the MCP server's tools are {tools}")
        session, tool = found
        client = session.client
        if client is None:
            raise ToolError(f"{name}: the MCP server {session.spec.name} {session.error or 'has closed its session'}")
        timeout = self._limit()
        try:
            result = self._wait(client.call_tool(tool.name, args), timeout, f"its {name} call")
        except TimeoutError:
            raise ToolError(f"{name}: the MCP server {session.spec.name} gave no answer within {timeout:.1f} s") from None
        except (StepStopped, ToolError):
            raise
        except Exception as exc:  # the session's own failure (a dead server, a malformed answer)
            raise ToolError(f"{name}: the MCP server {session.spec.name} failed ({_why(exc)})") from None
        text = _cut(result_text(result))
        if result.is_error:
            raise ToolError(text or f"{name}: the tool answered an error")
        return text

    # -- the end -------------------------------------------------------------------------

    def close(self) -> None:
        """End every session and the loop (the attempt is over); bounded, never raising."""
        loop = self._loop
        if loop is None:
            return
        self._loop = None

        async def end() -> None:
            for session in self._sessions:
                if session.closing is not None:
                    session.closing.set()
            tasks = [s.task for s in self._sessions if s.task is not None]
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
                for task in pending:
                    task.cancel()

        try:
            asyncio.run_coroutine_threadsafe(end(), loop).result(timeout=CLOSE_WAIT_S + EXIT_GRACE_S * 3)
        except Exception:  # closing never fails an attempt: what did not end in time is abandoned
            pass
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=CLOSE_WAIT_S)
            if not self._thread.is_alive():
                loop.close()


def result_text(result: mcp_types.CallToolResult) -> str:
    """A tool result's content as text: each text block, each other block described."""
    import mcp_types

    parts = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data):,} characters of base64]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            inner = block.resource
            text = (
                inner.text
                if isinstance(inner, mcp_types.TextResourceContents)
                else f"[binary, {len(inner.blob):,} characters of base64]"
            )
            parts.append(f"[resource {inner.uri}]\n{text}")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _cut(text: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    return text[:MAX_RESULT_CHARS] + f"\n[result cut at {MAX_RESULT_CHARS:,} of {len(text):,} characters]"
