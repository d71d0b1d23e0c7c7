"""MCP servers (agent.md or AGENTS.md `mcp:`): each entry is a Model Context Protocol server
whose tools the step's model may call, as `mcp__<name>__<tool>`.

An entry is either a program laneflow starts and talks to on its stdin and stdout,
`{name, command, args (optional), env (optional)}`, or a streamable HTTP endpoint,
`{name, url, headers (optional)}`:
- `name`: what its tools are named after (at most 40 characters; any character outside
  `[A-Za-z0-9_-]` becomes `_` in a tool's name), each name once;
- `command`: the program (found on the step's PATH, or a path); `args`: a list of strings;
- `env`: name -> value, the server's own environment variables;
- `url`: `http://` or `https://`, a host, an optional port and path; no user or password
  (put credentials in a header), no fragment;
- `headers`: name -> value, sent with every request.

An `env` or header value may name a declared secret as `${NAME}` (it must be in the agent's
`secrets:`, as a plain NAME): the value is filled in when the server is started (or each
request sent) and never recorded. AGENTS.md's entries are every agent's; an agent's entry of
the same name replaces the workspace's (`merged`).

The prompt's `mcp` layer names each server and says its tools are `mcp__<server>__<tool>`;
it does not list the tools. Listing them needs the servers running, and the layer is part of
the cached prefix, computed before the attempt starts anything: the tool definitions the
model is given carry each tool's description and input schema.

This module is pure: parsing and checking the entries (what `laneflow check` reports, with
file, line and field) and naming the tools. Starting and calling the servers is
`adapters/executors/mcp_tools.py`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from laneflow.domain.entries import SECRET_REF, EntryProblems
from laneflow.domain.errors import Problem

MCP_PREFIX = "mcp__"

STDIO_KEYS = ("name", "command", "args", "env")

HTTP_KEYS = ("name", "url", "headers")

ENTRY_KEYS = ("name", "command", "args", "env", "url", "headers")

MAX_NAME = 40

MAX_TOOL_NAME = 64  # what the Messages API takes for a tool's name


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")


def safe(text: str) -> str:
    """`text` with every character outside `[A-Za-z0-9_-]` made `_`."""
    return _UNSAFE.sub("_", text)


def tool_name(server: str, tool: str) -> str:
    """The name a server's tool is given: `mcp__<server>__<tool>`, cut to what the API takes."""
    return f"{MCP_PREFIX}{safe(server)}__{safe(tool)}"[:MAX_TOOL_NAME]


class McpServer(BaseModel):
    """One `mcp:` entry, checked: a stdio program (`command`) or an HTTP endpoint (`url`)."""

    name: str
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)  # values as written (`${NAME}` unfilled)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)  # values as written (`${NAME}` unfilled)

    @property
    def prefix(self) -> str:
        """What each of its tools' names starts with."""
        return f"{MCP_PREFIX}{safe(self.name)}__"

    @property
    def secret_names(self) -> list[str]:
        """The declared secrets its env or headers name, in order, each once."""
        values = [*self.env.values(), *self.headers.values()]
        return list(dict.fromkeys(m.group(1) for value in values for m in SECRET_REF.finditer(value)))

    def where(self) -> str:
        """What the prompt layer and the trace say it is (never a value of its env or headers)."""
        if self.url is not None:
            return f"the MCP server at {self.url.split('?')[0]}"
        return f"the program {self.command}"


# --------------------------------------------------------------------------- checking entries


@dataclass
class _Checker(EntryProblems):
    secrets: list[str] | None  # the agent's `secrets:` as written; None: not checked here (AGENTS.md)

    def entry(self, index: int, raw: Any, seen: set[str]) -> McpServer | None:
        if not isinstance(raw, dict):
            self.error(index, "", "an MCP server is a mapping: {name, command, args, env} or {name, url, headers}")
            return None
        before = len(self.problems)
        self.unknown_keys(index, raw, ENTRY_KEYS, "an MCP server")
        name = self.name(index, raw.get("name"), seen)
        kind = self.kind(index, raw)
        command = self.text(index, "command", raw.get("command")) if kind == "stdio" else None
        url = self.url(index, raw.get("url")) if kind == "http" else None
        args = self.args(index, raw.get("args"))
        env = self.mapping(index, "env", raw.get("env"), _ENV_NAME, "an environment variable's name")
        headers = self.mapping(index, "headers", raw.get("headers"), _HEADER_NAME, "a header name")
        if len(self.problems) != before or name is None or kind is None:
            return None
        return McpServer(name=name, command=command, args=args or [], env=env or {}, url=url, headers=headers or {})

    def name(self, index: int, name: Any, seen: set[str]) -> str | None:
        if name is None:
            self.error(index, "name", "an MCP server needs 'name:' (its tools are mcp__<name>__<tool>)")
            return None
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or "\x00" in name:
            self.error(index, "name", f"name is text of 1 to {MAX_NAME} characters, got {name!r}")
            return None
        if safe(name) in seen:
            self.error(index, "name", f"MCP server {name!r} is listed twice (its tools' names would clash)")
            return None
        seen.add(safe(name))
        return name

    def kind(self, index: int, raw: dict[Any, Any]) -> str | None:
        has_command, has_url = raw.get("command") is not None, raw.get("url") is not None
        if has_command and has_url:
            self.error(index, "url", "an MCP server is a program (command:) or an endpoint (url:), not both")
            return None
        if not (has_command or has_url):
            self.error(index, "command", "an MCP server needs 'command:' (a program to start) or 'url:' (an HTTP endpoint)")
            return None
        wrong = [k for k in (HTTP_KEYS if has_command else STDIO_KEYS) if k != "name" and raw.get(k) is not None]
        for key in wrong:
            what = "an endpoint (url:)" if has_command else "a program (command:)"
            self.error(index, key, f"{key} belongs to {what}; this server is {'a program' if has_command else 'an endpoint'}")
        return None if wrong else ("stdio" if has_command else "http")

    def text(self, index: int, field: str, value: Any) -> str | None:
        if not isinstance(value, str) or not value.strip() or "\x00" in value:
            self.error(index, field, f"{field} is a program's name or path, got {value!r}")
            return None
        return value

    def args(self, index: int, value: Any) -> list[str] | None:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(a, str) and "\x00" not in a for a in value):
            self.error(index, "args", "args is a list of strings")
            return None
        if any(SECRET_REF.search(a) for a in value):
            self.error(index, "args", "args cannot name a secret (a program's arguments are seen by others): put it in env")
            return None
        return list(value)

    def url(self, index: int, url: Any) -> str | None:
        problem = url_problem(url)
        if problem:
            self.error(index, "url", problem)
            return None
        return str(url)

    def mapping(self, index: int, field: str, value: Any, key_pattern: re.Pattern[str], what: str) -> dict[str, str] | None:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(index, field, f"{field} is a mapping of name to value")
            return None
        good: dict[str, str] = {}
        for key, item in value.items():
            where = f"{field}.{key}"
            if not isinstance(key, str) or not key_pattern.match(key):
                self.error(index, where, f"{key!r} is not {what}")
                continue
            if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                self.error(index, where, "a value is text (it may name a secret as ${NAME})")
                continue
            text = str(item)
            if any(c in text for c in "\r\n\x00") if field == "headers" else "\x00" in text:
                self.error(
                    index, where, "a value cannot hold a line break or NUL" if field == "headers" else "a value cannot hold NUL"
                )
                continue
            for message in secret_problems(text, self.secrets):
                self.error(index, where, f"{key} {message}")
            good[key] = text
        return good


def secret_problems(text: str, secrets: list[str] | None) -> list[str]:
    """Why each `${NAME}` in `text` cannot be filled from the declared `secrets` (none when
    `secrets` is None: not checked)."""
    if secrets is None:
        return []
    plain = {s for s in secrets if isinstance(s, str) and not s.startswith("@")}
    files = {s[1:] for s in secrets if isinstance(s, str) and s.startswith("@")}
    found = []
    for ref in SECRET_REF.findall(text):
        if ref in files:
            found.append(f"names secret {ref}, which is declared as a file (@{ref}); declare it as {ref} to use it here")
        elif ref not in plain:
            close = difflib.get_close_matches(ref, sorted(plain), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            found.append(f"names secret {ref}, which is not in this agent's secrets:{hint}")
    return found


def url_problem(url: Any) -> str:
    """Why `url` cannot be an MCP server's endpoint ("" when it can)."""
    if url is None:
        return "an endpoint needs 'url:' (such as https://mcp.example.com/mcp)"
    if not isinstance(url, str) or not url.strip():
        return "url is a URL such as https://mcp.example.com/mcp"
    if any(c in url for c in " \r\n\t\x00\\"):
        return "url cannot hold spaces, line breaks or backslashes"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as e:
        return f"url is not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return f"url must start with http:// or https://, got {parts.scheme or 'no scheme'}"
    if not parts.hostname:
        return "url has no host"
    if parts.username is not None or parts.password is not None:
        return "url cannot carry a user or password; put credentials in a header naming a secret (${NAME})"
    if parts.fragment or url.endswith("#"):
        return "url cannot carry a fragment"
    return ""


def check_mcp(raw: Any, *, rel: str, lines: dict[str, int], secrets: Any) -> tuple[list[McpServer], list[Problem]]:
    """An `mcp:` as written: (the checked servers, the problems, each naming the file, the
    entry's line and its field). `secrets`: the agent's `secrets:` as written (each `${NAME}`
    is checked against them), or None for AGENTS.md's entries (checked agent by agent)."""
    if raw is None:
        return [], []
    problems: list[Problem] = []
    if not isinstance(raw, list):
        message = "mcp is a list of servers: {name, command, args, env} or {name, url, headers}"
        return [], [Problem(file=rel, line=lines.get("mcp"), field="mcp", message=message)]
    declared = None if secrets is None else (list(secrets) if isinstance(secrets, list) else [])
    checker = _Checker(setting="mcp", rel=rel, lines=lines, problems=problems, secrets=declared)
    seen: set[str] = set()
    servers = [server for index, entry in enumerate(raw) if (server := checker.entry(index, entry, seen)) is not None]
    return servers, problems


def merged(
    workspace: list[McpServer], own: list[McpServer], *, secrets: list[str], rel: str, agent: str
) -> tuple[list[McpServer], list[Problem]]:
    """An agent's servers: AGENTS.md's, each replaced by the agent's own of the same name, then
    the agent's others; with a problem (naming AGENTS.md) for each `${NAME}` of a workspace
    server the agent keeps that is not one of its declared secrets."""
    mine = {safe(s.name) for s in own}
    kept = [(index, s) for index, s in enumerate(workspace) if safe(s.name) not in mine]
    problems = []
    for index, server in kept:
        for field, values in (("env", server.env), ("headers", server.headers)):
            for key, value in values.items():
                for message in secret_problems(value, secrets):
                    problems.append(
                        Problem(
                            file=rel,
                            field=f"mcp[{index}].{field}.{key}",
                            message=f"{key} {message.replace('this agent', f'agent {agent}')}",
                        )
                    )
    return [s for _, s in kept] + list(own), problems


def layer_text(servers: list[McpServer]) -> str:
    """The `mcp` prompt layer: each server by name, what it is, and how its tools are named.
    Stable: it changes only when an `mcp:` entry does."""
    if not servers:
        return ""
    parts = [
        "# MCP servers",
        "Each server's tools are named mcp__<server>__<tool>; their descriptions and inputs come with the tools. "
        "A server that cannot be reached answers an error; go on without it.",
    ]
    parts.extend(f"- {server.prefix}*: {server.where()}" for server in servers)
    return "\n".join(parts)
