"""The finding tools of a step (`domain/tools.py`): `search` (`tools: [search]`), the lines of
the step's workspace copy that hold a text, and `history` (`tools: [history]`), the lines of
the conclusions of the workspace's earlier runs that hold one. Both executors reach them
through `StepTools`: the Claude tool-use loop and the stub's `tool:` lines.

- `search` reads only the folders its `in` names, inside the step's copy of the workspace:
  `knowledge` (the agent's own `knowledge/` and the shared one), `storage`, `memory` (the
  agent's own `memory/` and the shared one), `state`, or `all` of them. Each file is resolved
  and read only where the file tools could read it (no symlink leads out of those folders);
  a file that is not UTF-8 text, holds a NUL byte, or is larger than MAX_FILE_BYTES is passed
  over, and at most MAX_FILES files are read a call.
- `history` reads through the `Store` port, so both stores serve it the same way: the
  tenant's MAX_RUNS newest runs (`list_runs`, an index on DynamoDB, never a scan), those of
  this workspace (and of `flow`, if given) other than the calling run, then the steps of
  each (`get_steps`), newest run first and later steps first. The store masks what it
  writes, so a conclusion comes back as stored; each answered line is masked by the store's
  redactor once more (a value it holds now).
- A match is a line holding the query, compared case-blind (a plain text, not a pattern);
  at most MAX_MATCHES are answered (`limit`, DEFAULT_LIMIT unless given), each line cut at
  MAX_LINE_CHARS. Input that is not what the tool takes is a `ToolError` naming the field: an
  `is_error` result for the model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from laneflow.adapters.executors.tools import FileTools, ToolError
from laneflow.domain.errors import RunNotFound
from laneflow.domain.records import Run
from laneflow.domain.tools import HISTORY, SEARCH
from laneflow.ports import ExecutionSink, StepJob, Store

MAX_MATCHES = 200

DEFAULT_LIMIT = 50

MAX_QUERY_CHARS = 1_000

MAX_LINE_CHARS = 400

MAX_FILE_BYTES = 1_000_000  # a larger file is passed over (a data dump, not a note)

MAX_FILES = 5_000  # files read by one search at most

MAX_RUNS = 200  # the tenant's newest runs one history call reads

SNIFF_BYTES = 8_192  # a NUL among a file's first bytes: a binary file, passed over

# The shared folders (the file tools' own: laneflow.adapters.executors.tools.SHARED), in the
# order `all` reads them; of these, an agent has its own `knowledge/` and `memory/` too.
FOLDERS = ("knowledge", "storage", "memory", "state")

OWN_FOLDERS = ("knowledge", "memory")

PLACES = (*FOLDERS, "all")

DEFINITIONS: dict[str, dict[str, Any]] = {
    SEARCH: {
        "name": SEARCH,
        "description": (
            "Find the lines holding a text (case-blind, plain text, not a pattern) in the workspace's files: "
            "knowledge (yours and the shared one), storage, memory (yours and the shared one), state, or all of them. "
            f"Answers `path:line: text` lines, at most {MAX_MATCHES}; files that are not text or larger than "
            f"{MAX_FILE_BYTES:,} bytes are passed over."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "the text to find"},
                "in": {"type": "string", "enum": list(PLACES), "description": "where to look (default all)"},
                "limit": {
                    "type": "integer",
                    "description": f"at most this many lines (default {DEFAULT_LIMIT}, at most {MAX_MATCHES})",
                },
            },
            "required": ["query"],
        },
    },
    HISTORY: {
        "name": HISTORY,
        "description": (
            "Find the lines holding a text (case-blind, plain text) in what the steps of this workspace's earlier runs "
            f"concluded, newest run first, among the {MAX_RUNS} newest runs. Each match names the run, its date, the step, "
            "the agent and the line."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "the text to find"},
                "flow": {"type": "string", "description": "only the runs of this flow"},
                "limit": {
                    "type": "integer",
                    "description": f"at most this many lines (default {DEFAULT_LIMIT}, at most {MAX_MATCHES})",
                },
            },
            "required": ["query"],
        },
    },
}


def granted(tools: tuple[str, ...] | list[str]) -> list[str]:
    """The finding tools `tools:` grants, in name order."""
    return sorted(name for name in DEFINITIONS if name in tools)


def _query(name: str, args: dict[str, Any]) -> str:
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ToolError(f"{name}: query must be a non-empty string: the text to find")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"{name}: query is too long ({len(query):,} characters; at most {MAX_QUERY_CHARS:,})")
    if "\x00" in query or "\n" in query or "\r" in query:
        raise ToolError(f"{name}: query must be one line of text (no NUL or line break): a match is a line")
    return query.casefold()


def _limit(name: str, args: dict[str, Any]) -> int:
    limit = args.get("limit", DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ToolError(f"{name}: limit must be a whole number of lines, 1 or more (at most {MAX_MATCHES} are answered)")
    return min(limit, MAX_MATCHES)


def _refuse_unknown(name: str, args: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise ToolError(f"{name} takes {', '.join(known)}; not {', '.join(map(str, unknown))}")


def _shown_line(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"


def _answer(found: list[str], more: bool, limit: int, nothing: str) -> str:
    if not found:
        return nothing
    return "\n".join(found) + (f"\n[stopped at {limit} matches: narrow the query]" if more else "")


class FindingTools:
    """The finding tools one attempt has: `search` over `job.workspace_root`, `history`
    through the store its sink reads runs from (`sink.runs`, when it has one)."""

    def __init__(self, job: StepJob, sink: ExecutionSink, *, reach: FileTools | None = None):
        self.job = job
        self.root = reach.root if reach else Path(job.workspace_root).resolve() if job.workspace_root else None
        self._own = job.agent_path.strip("/")
        # Where a file may be read is the file tools' rule, asked of them (the step's own,
        # when its tools are built together).
        self._reach = reach if reach else FileTools(self.root, job.agent_path) if self.root else None
        self.runs: Store | None = getattr(sink, "runs", None)
        # Granted by `tools:`, so listed (a definition is part of the cached prefix) whatever
        # the sink or the workspace: the prefix never depends on where the step runs.
        self.names = granted(job.tools)

    def definitions(self) -> list[dict[str, Any]]:
        return [DEFINITIONS[name] for name in self.names]

    def run(self, name: str, args: dict[str, Any]) -> str:
        if name == SEARCH:
            return self.search(args)
        return self.history(args)

    # -- search ------------------------------------------------------------------------------

    def folders(self, where: str) -> list[str]:
        """The folders `in: where` searches, relative to the workspace, in the order read."""
        places = FOLDERS if where == "all" else (where,)
        rels: list[str] = []
        for place in places:
            if self._own and place in OWN_FOLDERS:
                rels.append(f"{self._own}/{place}")
            rels.append(place)
        return rels

    def _readable(self, target: Path) -> bool:
        """Whether `target`, a resolved path, is where the file tools could read it: inside
        the workspace, in the agent's own folder or a shared one."""
        assert self._reach is not None
        return self._reach.may_read(target)

    def _files(self, rel: str) -> Iterator[tuple[str, Path]]:
        """(the path shown, the resolved file) of every file under `rel`, in name order."""
        assert self.root is not None
        top = self.root / rel
        try:
            if not top.is_dir() or not self._readable(top.resolve()):
                return
        except (OSError, RuntimeError):
            return
        for here, dirs, names in os.walk(top):  # never descends into a linked folder
            dirs.sort()
            for file_name in sorted(names):
                path = Path(here, file_name)
                try:
                    target = path.resolve()
                    if not self._readable(target) or not target.is_file():
                        continue
                except (OSError, RuntimeError):  # a symlink loop, an unreadable link
                    continue
                yield path.relative_to(self.root).as_posix(), target

    @staticmethod
    def _lines(target: Path) -> list[str]:
        """A file's lines, or none when it is not a text file this tool reads."""
        try:
            if target.stat().st_size > MAX_FILE_BYTES:
                return []
            data = target.read_bytes()
        except OSError:
            return []
        if len(data) > MAX_FILE_BYTES or b"\x00" in data[:SNIFF_BYTES]:
            return []
        try:
            return data.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            return []

    def _matches(self, where: str, query: str) -> Iterator[str]:
        """Every matching line under the folders `in: where` names, as `path:line: text`,
        each file read once; a last "[stopped ...]" line when MAX_FILES were read."""
        seen: set[Path] = set()
        for rel in self.folders(where):
            for shown, target in self._files(rel):
                if target in seen:
                    continue
                if len(seen) == MAX_FILES:
                    yield f"[stopped at {MAX_FILES:,} files read: search a narrower folder]"
                    return
                seen.add(target)
                for number, line in enumerate(self._lines(target), start=1):
                    if query in line.casefold():
                        yield f"{shown}:{number}: {_shown_line(line)}"

    def search(self, args: dict[str, Any]) -> str:
        _refuse_unknown(SEARCH, args, ("query", "in", "limit"))
        query, limit = _query(SEARCH, args), _limit(SEARCH, args)
        where = args.get("in", "all")
        if not isinstance(where, str) or where not in PLACES:
            raise ToolError(f"search: in must be one of {', '.join(PLACES)}; not {str(where)[:60]!r}")
        if self.root is None:
            raise ToolError("search: this step has no workspace to search")
        found: list[str] = []
        for match in self._matches(where, query):
            if len(found) == limit and not match.startswith("[stopped"):
                return _answer(found, True, limit, "")
            found.append(match)
        searched = ", ".join(r + "/" for r in self.folders(where))
        return _answer(found, False, limit, f"no line holds {args['query']!r} in {searched}")

    # -- history -----------------------------------------------------------------------------

    def _earlier_runs(self, store: Store, flow: str | None) -> list[Run]:
        """This workspace's runs among the tenant's MAX_RUNS newest, newest first, the calling one left out."""
        job = self.job
        try:
            this = store.get_run(job.tenant, job.run_id, steps=False, input=False)
        except RunNotFound:
            raise ToolError("history: this step's run is not in the store") from None
        runs = store.list_runs(job.tenant, limit=MAX_RUNS)
        return [r for r in runs if r.id != job.run_id and r.workspace == this.workspace and (flow is None or r.flow == flow)]

    def history(self, args: dict[str, Any]) -> str:
        _refuse_unknown(HISTORY, args, ("query", "flow", "limit"))
        query, limit = _query(HISTORY, args), _limit(HISTORY, args)
        flow = args.get("flow")
        if flow is not None and (not isinstance(flow, str) or not flow.strip()):
            raise ToolError("history: flow must be a flow's name (text), or left out for every flow")
        store = self.runs
        if store is None:
            raise ToolError("history: this step has no run records to read here")
        redact = store.redactor
        found: list[str] = []
        for run in self._earlier_runs(store, flow):
            steps = store.get_steps(self.job.tenant, run.id, messages=False)
            for step in sorted(steps, key=lambda s: s.index, reverse=True):
                for line in (step.conclusion or "").splitlines():
                    if query not in line.casefold():
                        continue
                    if len(found) == limit:
                        return _answer(found, True, limit, "")
                    found.append(redact(f"{run.id} {run.created_at} step {step.index} {step.agent or '-'}: {_shown_line(line)}"))
        of = f" of flow {flow!r}" if flow else ""
        return _answer(found, False, limit, f"no earlier run{of} of this workspace concluded a line holding {args['query']!r}")
