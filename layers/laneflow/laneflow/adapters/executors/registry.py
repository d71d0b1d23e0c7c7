"""One step's tools (`StepTools`): the file tools, `bash`, the script tools and the colleague,
API, finding and MCP tools its agent.md grants, with their definitions in a stable order (they
are part of the cached prompt prefix), run the same way for the Claude executor and the
stub's `tool:` lines.

`bash` and the script tools run programs in the step's scratch copy of the workspace under
the machine's strongest isolation (`isolation.py`), each call time-limited (what is left of
the agent's `timeout:` for the step, else DEFAULT_CALL_TIMEOUT_S), each output cut at MAX_OUTPUT_CHARS saying so.
A program's own failure (a non-zero exit, its time limit, input that is not what the tool
takes, a script that cannot start) is a `ToolError`: an `is_error` result for the model. A
stop kills the program's process group and ends the attempt (`StepStopped`); a program killed
for memory (memory.py) ends it too, to be tried again one size up (domain/sizes.py).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from laneflow.adapters.executors.api_tools import DEFAULT_API_TIMEOUT_S, ApiTools
from laneflow.adapters.executors.delegate_tool import DelegateTool
from laneflow.adapters.executors.egress_proxy import StepNetwork
from laneflow.adapters.executors.finding import FindingTools
from laneflow.adapters.executors.isolation import Isolation, ScratchFence, amount, detect, limits_for, sandbox_uid
from laneflow.adapters.executors.mcp_tools import Launch, McpTools, fenced, plain
from laneflow.adapters.executors.memory import memory_kill, oom_kills
from laneflow.adapters.executors.peers import PeerTools
from laneflow.adapters.executors.programs import Finished, run_program
from laneflow.adapters.executors.tools import DEFINITION, FileTools, ToolError
from laneflow.adapters.executors.web import WebTools
from laneflow.domain.errors import StepFailed, StepStopped
from laneflow.domain.records import EventType
from laneflow.domain.secrets import secret_file_folders
from laneflow.domain.sizes import memory_failure
from laneflow.domain.tools import BASH, FILE_TOOLS, ScriptTool, discover_scripts, granted, grants_scripts
from laneflow.ports import Delegator, ExecutionSink, StepInbox, StepJob
from laneflow.settings import settings

MAX_OUTPUT_CHARS = 30_000

DEFAULT_CALL_TIMEOUT_S = 300.0

# What a program sees of the machine's settings, when laneflow's own environment sets none.
DEFAULT_LANG = "C.UTF-8"

DEFAULT_TZ = "UTC"


def program_env(job: StepJob, scratch: Path) -> dict[str, str]:
    """The whole environment of a step's programs: the listed variables and the declared
    secrets, nothing else of laneflow's own (never the model's key or any credential)."""
    host = settings()  # the machine's LANG and TZ, as this process was started with them
    env = dict(job.secret_env)
    env.update(
        {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(scratch),
            "LANG": host.host_lang or DEFAULT_LANG,
            "TZ": host.host_tz or DEFAULT_TZ,
            "LANEFLOW_RUN_ID": job.run_id,
            "LANEFLOW_STEP": str(job.index),
            "LANEFLOW_AGENT": job.agent,
            "LANEFLOW_WORKSPACE": str(scratch),
        }
    )
    return env


def _cut(label: str, text: str, total: int) -> str:
    if total <= MAX_OUTPUT_CHARS and len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[:MAX_OUTPUT_CHARS] + f"\n[{label} cut at {MAX_OUTPUT_CHARS:,} of {total:,} characters]"


def _report(done: Finished) -> str:
    head = f"exit code: {done.exit_code}" if done.exit_code is not None else "exit code: none (killed)"
    return (
        f"{head}\n--- stdout ---\n{_cut('stdout', done.stdout, done.stdout_chars)}"
        f"\n--- stderr ---\n{_cut('stderr', done.stderr, done.stderr_chars)}"
    )


def _definitions_read_only(scratch: Path) -> list[Path]:
    """Every agent's definition in the scratch copy and the workspace's scripts: mounted
    read-only where the isolation can, so no program rewrites an agent."""
    paths = [scratch / "scripts"] if (scratch / "scripts").is_dir() else []
    agents = scratch / "agents"
    if agents.is_dir():
        for folder in sorted(p for p in agents.iterdir() if p.is_dir()):
            paths += [folder / name for name in DEFINITION if (folder / name).exists()]
    return paths


class StepTools:
    """The tools one attempt of one step may use (see the module docstring)."""

    def __init__(self, job: StepJob, sink: ExecutionSink, *, isolation: Isolation | None = None):
        self.job, self.sink = job, sink
        self.root = Path(job.workspace_root) if job.workspace_root else None
        # Scripts are found only where `tools:` could grant one: the folder walk is most of
        # what building a step's tools costs, and most steps name no script.
        scripts = discover_scripts(self.root, job.agent_path) if self.root and grants_scripts(job.tools) else []
        plain, chosen = granted(job.tools, scripts)
        self.files = FileTools(self.root, job.agent_path) if self.root else None
        self.file_names = [n for n in plain if n in FILE_TOOLS] if self.files else []
        self.bash = BASH in plain and self.root is not None
        self.scripts: dict[str, ScriptTool] = {s.name: s for s in chosen} if self.root else {}
        self._isolation = isolation
        self.limits = limits_for(job.size)
        self._fence: ScratchFence | None = None  # how the scratch's size binds, found by `prepare` (or the first program)
        self.colleagues = PeerTools(job, sink)  # peers_list, peers_message, ask (peers.py)
        self.apis = ApiTools(job.apis, job.secret_env)  # api_<name>: HTTP calls, made by this process
        self.finding = FindingTools(job, sink, reach=self.files)  # search, history (finding.py)
        self.delegation = DelegateTool(job, sink)  # delegate (delegate_tool.py)
        self.web = WebTools(job)  # web_search, web_fetch: run by the API (web.py)
        self.network = StepNetwork(job.network, sink)  # its `network:`, through the egress proxy (egress_proxy.py)
        # The step's `timeout:` bounds its programs too: no call outlives the step's deadline.
        self._deadline = time.monotonic() + job.timeout if job.timeout else None
        self.mcp = McpTools(job.mcp, job.secret_env, sink, launcher=self._mcp_launch, deadline=self._deadline)  # mcp_tools.py

    def _mcp_launch(self, argv: list[str], env: dict[str, str]) -> Launch:
        """How a stdio MCP server starts: in the step's sandbox, wrapped as its programs are, or
        (a step that is not sandboxed) a plain child process."""
        if not (self.job.sandboxed and self.root is not None):
            host = settings()
            return plain(argv, env, folder=self.root, lang=host.host_lang or DEFAULT_LANG, tz=host.host_tz or DEFAULT_TZ)
        return fenced(
            argv,
            env,
            isolation=self.isolation,
            scratch=self.root,
            base_env=program_env(self.job, self.root),
            limits=self.limits,
            read_only=_definitions_read_only(self.root),
            readable=[Path(f) for f in secret_file_folders(self.job.secret_env)],
        )

    def close(self) -> None:
        """The attempt is over: its MCP servers' sessions end."""
        self.mcp.close()

    @property
    def runs_programs(self) -> bool:
        return self.bash or bool(self.scripts)

    @property
    def isolation(self) -> Isolation:
        if self._isolation is None:
            self._isolation = detect()
        return self._isolation

    @property
    def fence(self) -> ScratchFence | None:
        """How the scratch's `size:` binds (None without a workspace). A copy already larger
        than its size fails the attempt: no program could run in it."""
        if self._fence is None and self.root is not None:
            try:
                self._fence = ScratchFence.bind(self.root, self.limits.scratch_bytes)
            except OSError as exc:
                raise StepFailed(
                    f"its scratch copy cannot be held to its size ({self.job.size or 'medium'}): {exc.strerror}", retryable=False
                ) from None
        return self._fence

    @property
    def names(self) -> list[str]:
        return sorted(
            [
                *self.file_names,
                *([BASH] if self.bash else []),
                *self.scripts,
                *self.colleagues.names,
                *self.apis.names,
                *self.finding.names,
                *self.delegation.names,
                *self.web.names,
                *self.mcp.names,
            ]
        )

    def prepare(self) -> None:
        """Before the first model call: the trace names the isolation the step's programs
        get, and `network_enforce: true` where it cannot be enforced fails the attempt. The
        trace also names the step's API tools, where each reaches and which headers it sends."""
        if self.apis.apis:
            self.sink.event(EventType.info, self.apis.describe(), {"apis": self.apis.names})
        if not (self.runs_programs or self.job.sandboxed):
            return
        isolation = self.isolation
        fence = self.fence
        self.sink.event(
            EventType.info,
            isolation.describe(self.limits, fence, network=self.network.allowlist.describe() if self.network.allowlist else ""),
            {
                "isolation": isolation.name,
                "network_enforced": isolation.network_enforced,
                "network": self.network.data(),
                "limits": self.limits.as_data(),
                "scratch": "tmpfs" if fence and fence.tmpfs else "measured",
            },
        )
        if self.job.network_enforce and not isolation.network_enforced:
            listed = (
                f": its network: list ({self.network.allowlist.describe()}) cannot be enforced" if self.network.allowlist else ""
            )
            raise StepFailed(
                f"network_enforce is set (AGENTS.md) but this machine cannot enforce the network ({isolation.name} isolation, "
                f"no network namespace){listed}; install bubblewrap or run it where the network can be fenced",
                retryable=False,
            )
        if (why := self.network.unavailable(isolation)) is not None:
            raise StepFailed(why, retryable=False)

    # -- definitions ---------------------------------------------------------------------

    def definitions(self) -> list[dict[str, Any]]:
        defs = {d["name"]: d for d in (self.files.definitions(tuple(self.file_names)) if self.files and self.file_names else [])}
        if self.bash:
            defs[BASH] = {
                "name": BASH,
                "description": (
                    "Run a bash command in your sandbox: the working folder is a copy of the workspace. "
                    f"Returns the exit code, stdout and stderr (each cut at {MAX_OUTPUT_CHARS:,} characters)."
                ),
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
            }
        for name, script in self.scripts.items():
            defs[name] = {
                "name": name,
                "description": (script.description or f"Runs {script.path}.") + f" (the script {script.path})",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "args": {"type": "array", "items": {"type": "string"}, "description": "its command-line arguments"},
                        "stdin": {"type": "string", "description": "what it reads on its standard input"},
                    },
                },
            }
        defs.update({d["name"]: d for d in self.colleagues.definitions()})
        defs.update({d["name"]: d for d in self.apis.definitions()})
        defs.update({d["name"]: d for d in self.finding.definitions()})
        defs.update({d["name"]: d for d in self.delegation.definitions()})
        defs.update({d["name"]: d for d in self.web.definitions()})
        defs.update({d["name"]: d for d in self.mcp.definitions()})
        return [defs[name] for name in sorted(defs)]

    # -- one call ------------------------------------------------------------------------

    def run(self, name: str, args: Any) -> str:
        """Do one tool call and return its output; its own failure is a `ToolError`."""
        if not isinstance(args, dict):
            raise ToolError(f"{name} takes a JSON object of arguments, not {type(args).__name__}")
        if name in self.file_names and self.files is not None:
            return self.files.run(name, args)
        if name == BASH and self.bash:
            return self._bash(args)
        family = self._family(name)
        if family is not None:
            return family(args)
        script = self.scripts.get(name)
        if script is not None:
            argv, stdin = self._script_input(name, args)
            return self._program(name, [str(self.root / script.path), *argv], stdin)  # type: ignore[operator]
        if name in self.apis.apis:
            return self.apis.run(name, args, timeout_s=self._call_timeout(DEFAULT_API_TIMEOUT_S), stopped=self.sink.stopped)
        if name in self.web.names:
            raise ToolError(f"{name} is a server tool: the model API runs it, not this step")
        raise ToolError(f"no tool {name!r}; this step's tools are {', '.join(self.names) or 'none'}")

    def _family(self, name: str) -> Callable[[dict[str, Any]], str] | None:
        """The tool family that runs `name` (colleagues, finding, delegation, MCP), if one does."""
        if name in self.colleagues.names:
            return lambda args: self.colleagues.run(name, args)
        if name in self.finding.names:
            return lambda args: self.finding.run(name, args)
        if name in self.delegation.names:
            return self.delegation.run
        if self.mcp.owns(name):
            return lambda args: self.mcp.run(name, args)
        return None

    def _bash(self, args: dict[str, Any]) -> str:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError('bash takes {"command": "..."}: a non-empty string')
        if "\x00" in command:
            raise ToolError("bash: a command cannot hold a NUL character")
        return self._program(BASH, [shutil.which("bash") or "/bin/bash", "-c", command], "")

    def _call_timeout(self, default: float) -> float:
        """A call's time limit: `default`, never past the step's deadline."""
        if self._deadline is None:
            return default
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise ToolError("the step's timeout is spent; no more calls can be made")
        return min(default, left)

    @staticmethod
    def _script_input(name: str, args: dict[str, Any]) -> tuple[list[str], str]:
        argv, stdin = args.get("args", []), args.get("stdin", "")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ToolError(f'{name} takes {{"args": [strings], "stdin": "text"}}: args must be a list of strings')
        if not isinstance(stdin, str):
            raise ToolError(f"{name}: stdin must be a string")
        if any("\x00" in a for a in argv):
            raise ToolError(f"{name}: an argument cannot hold a NUL character")
        return argv, stdin

    def _program(self, name: str, argv: list[str], stdin: str) -> str:
        assert self.root is not None
        started = time.monotonic()
        timeout = DEFAULT_CALL_TIMEOUT_S if self._deadline is None else max(0.1, self._deadline - started)
        oom_before = oom_kills()
        try:
            served = self.network.start(self.isolation, sandbox_uid())  # None without a network: list
            done = run_program(
                argv,
                isolation=self.isolation,
                scratch=self.root,
                env=program_env(self.job, self.root),
                stdin=stdin,
                timeout_s=timeout,
                limits=self.limits,
                stopped=self.sink.stopped,
                # The definitions stay read-only; the @NAME secret files' folders (in the host's
                # temp folder, which the sandbox's private /tmp would hide) are bound in read-only.
                read_only=_definitions_read_only(self.root),
                readable=[Path(f) for f in secret_file_folders(self.job.secret_env)],
                fence=self.fence,
                keep_chars=MAX_OUTPUT_CHARS,
                network=served,
            )
        except OSError as exc:
            why = exc.strerror if exc.strerror and exc.errno and exc.strerror != os.strerror(exc.errno) else None
            raise ToolError(
                f"{name} could not start: {why or (os.strerror(exc.errno) if exc.errno else type(exc).__name__)}"
            ) from None
        finally:
            self.network.stop()  # the proxy ends with the program; what it refused is recorded
        if done.stopped:
            raise StepStopped(f"stopped by a person (its {name} call was killed after {time.monotonic() - started:.1f} s)")
        report = _report(done)
        if (how := memory_kill(done, oom_before)) is not None:  # a model cannot make its sandbox larger
            raise memory_failure(self.job.size, f"{name} {how}", f"{amount(self.limits.memory_bytes)} a process")
        if done.over_scratch:
            raise ToolError(
                f"{name} was killed: the scratch grew past its {amount(self.limits.scratch_bytes)} "
                f"(size: {self.job.size or 'medium'}); remove files before going on\n{report}"
            )
        if done.timed_out:
            limit = f"the step's timeout of {self.job.timeout:g} s" if self._deadline else f"{DEFAULT_CALL_TIMEOUT_S:g} s a call"
            raise ToolError(f"{name} timed out and was killed after {time.monotonic() - started:.1f} s ({limit})\n{report}")
        if done.exit_code != 0:
            raise ToolError(report)
        return report


def input_text(args: Any) -> str:
    """A call's input as recorded (JSON)."""
    return json.dumps(args, ensure_ascii=False)


class _Silent:
    """A sink for reading a step's tool definitions: nothing runs, so nothing is reported."""

    inbox: StepInbox | None = None  # no colleagues to hear from: its colleague tools are listed, never run
    delegator: Delegator | None = None  # no delegate runs

    def first_event(self) -> None: ...

    def begin_turn(self) -> None: ...

    def call(self, span: Any) -> Any:
        return span

    def event(self, type: Any, text: str, data: dict[str, Any] | None = None) -> None: ...

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None: ...

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False) -> None: ...

    def stopped(self) -> bool:
        return False


def tool_definitions(job: StepJob) -> list[dict[str, Any]]:
    """The tool definitions a step's model request carries, in the order they are sent
    (`Services.tool_definitions`: the prefix's size, before or as the step runs). Its MCP
    servers' tools are left out: listing them would start the servers, which only an attempt
    does (in its sandbox)."""
    return StepTools(replace(job, mcp=()), _Silent()).definitions()
