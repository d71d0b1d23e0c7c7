"""The finding tools on their own (`adapters/executors/finding.py`): `search` answers
`path:line: text` lines of the folders its `in` names, case-blind, never outside the
workspace or the agent's reach, at most `limit` (capped at 200); a bad call is a `ToolError`
naming its field; both tools are listed where `StepTools` lists tools (the cached prefix) and
described in the stable `finding` prompt layer; `history` without a store to read says so."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import Sink, step_job

from laneflow.adapters.executors.finding import DEFAULT_LIMIT, MAX_FILE_BYTES, MAX_MATCHES, MAX_RUNS, FindingTools
from laneflow.adapters.executors.registry import StepTools, tool_definitions
from laneflow.adapters.executors.tools import ToolError
from laneflow.adapters.store import open_store
from laneflow.domain.prompt import build_system_prompt
from laneflow.domain.records import Run, Step, StepStatus
from laneflow.domain.tools import unknown_tools
from laneflow.domain.workspace import load_agent, load_workspace
from laneflow.ports import Store

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOW = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    for rel, text in {
        "knowledge/facts.md": "Water is WET.\nIce is cold.\n",
        "agents/worker/knowledge/own.md": "wet paint\n",
        "agents/worker/memory/notes.md": "it was wet yesterday\n",
        "agents/other/memory/theirs.md": "wet, but not yours\n",
        "storage/report.md": "dry\nwet\n",
        "memory/shared.md": "wet season\n",
        "state/cursor.txt": "wet=3\n",
        "flows/f.yaml": "wet: not a searched folder\n",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def finder(ws: Path, tools: tuple[str, ...] = ("search",)) -> FindingTools:
    return FindingTools(step_job(ws, tools=tools), Sink())


def lines(answer: str) -> list[str]:
    return answer.splitlines()


def test_search_answers_path_line_text_case_blind_across_every_folder(ws: Path) -> None:
    assert lines(finder(ws).search({"query": "wet"})) == [
        "agents/worker/knowledge/own.md:1: wet paint",
        "knowledge/facts.md:1: Water is WET.",
        "storage/report.md:2: wet",
        "agents/worker/memory/notes.md:1: it was wet yesterday",
        "memory/shared.md:1: wet season",
        "state/cursor.txt:1: wet=3",
    ]


@pytest.mark.parametrize(
    "where, expected",
    [
        ("knowledge", ["agents/worker/knowledge/own.md:1: wet paint", "knowledge/facts.md:1: Water is WET."]),
        ("storage", ["storage/report.md:2: wet"]),
        ("memory", ["agents/worker/memory/notes.md:1: it was wet yesterday", "memory/shared.md:1: wet season"]),
        ("state", ["state/cursor.txt:1: wet=3"]),
    ],
)
def test_in_narrows_the_search_to_its_folders(ws: Path, where: str, expected: list[str]) -> None:
    assert lines(finder(ws).search({"query": "WeT", "in": where})) == expected


def test_limit_cuts_the_answer_saying_so_and_never_passes_200(ws: Path) -> None:
    (ws / "storage" / "many.md").write_text("".join(f"hit {n}\n" for n in range(1, 301)))
    three = lines(finder(ws).search({"query": "hit", "in": "storage", "limit": 3}))
    assert three == [
        "storage/many.md:1: hit 1",
        "storage/many.md:2: hit 2",
        "storage/many.md:3: hit 3",
        "[stopped at 3 matches: narrow the query]",
    ]
    capped = lines(finder(ws).search({"query": "hit", "in": "storage", "limit": 10_000}))
    assert len(capped) == MAX_MATCHES + 1 and capped[-1] == f"[stopped at {MAX_MATCHES} matches: narrow the query]"
    assert capped[MAX_MATCHES - 1] == f"storage/many.md:{MAX_MATCHES}: hit {MAX_MATCHES}"
    default = lines(finder(ws).search({"query": "hit", "in": "storage"}))
    assert len(default) == DEFAULT_LIMIT + 1


def test_no_symlink_leads_search_outside_the_workspace_or_into_another_agents_folder(ws: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.md").write_text("wet outside\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "deep.md").write_text("wet deep outside\n")
    (ws / "storage" / "out.md").symlink_to(tmp_path / "outside.md")
    (ws / "storage" / "outdir").symlink_to(tmp_path / "outside", target_is_directory=True)
    (ws / "storage" / "theirs.md").symlink_to(ws / "agents" / "other" / "memory" / "theirs.md")
    (ws / "storage" / "loop").symlink_to(ws / "storage" / "loop")
    (ws / "state").rename(ws / "state-real")
    (ws / "state").symlink_to(tmp_path / "outside", target_is_directory=True)  # a whole folder leading out
    answer = finder(ws).search({"query": "wet"})
    assert "outside" not in answer and "not yours" not in answer and "loop" not in answer
    assert "storage/report.md:2: wet" in lines(answer)


def test_binary_undecodable_and_oversized_files_are_passed_over(ws: Path) -> None:
    (ws / "storage" / "blob.bin").write_bytes(b"wet\x00\x01\x02")
    (ws / "storage" / "latin1.txt").write_bytes(b"wet caf\xe9\n")
    (ws / "storage" / "huge.md").write_text("wet\n" + "x" * MAX_FILE_BYTES)
    assert lines(finder(ws).search({"query": "wet", "in": "storage"})) == ["storage/report.md:2: wet"]


def test_nothing_found_says_where_it_looked(ws: Path) -> None:
    assert finder(ws).search({"query": "lava", "in": "memory"}) == ("no line holds 'lava' in agents/worker/memory/, memory/")


@pytest.mark.parametrize(
    "args, field",
    [
        ({"query": "wet", "in": "moon"}, "in must be one of knowledge, storage, memory, state, all"),
        ({"query": "wet", "in": 3}, "in must be one of"),
        ({"in": "storage"}, "query must be a non-empty string"),
        ({"query": "  "}, "query must be a non-empty string"),
        ({"query": "a\nb"}, "query must be one line"),
        ({"query": "wet", "limit": 0}, "limit must be a whole number"),
        ({"query": "wet", "limit": "5"}, "limit must be a whole number"),
        ({"query": "wet", "limit": True}, "limit must be a whole number"),
        ({"query": "wet", "path": "storage"}, "search takes query, in, limit; not path"),
    ],
)
def test_a_bad_search_call_is_a_tool_error_naming_its_field(ws: Path, args: dict[str, object], field: str) -> None:
    tools = StepTools(step_job(ws, tools=("search",)), Sink())
    with pytest.raises(ToolError, match=field):
        tools.run("search", args)


@pytest.mark.parametrize(
    "args, field",
    [
        ({}, "query must be a non-empty string"),
        ({"query": "x", "flow": 7}, "flow must be a flow's name"),
        ({"query": "x", "limit": -1}, "limit must be"),
    ],
)
def test_a_bad_history_call_is_a_tool_error_naming_its_field(ws: Path, args: dict[str, object], field: str) -> None:
    with pytest.raises(ToolError, match=field):
        StepTools(step_job(ws, tools=("history",)), Sink()).run("history", args)


def test_history_without_run_records_to_read_says_so(ws: Path) -> None:
    with pytest.raises(ToolError, match="no run records to read"):
        finder(ws, ("history",)).history({"query": "wet"})


def test_search_without_a_workspace_is_still_listed_and_says_it_has_none(ws: Path) -> None:
    job = step_job(ws, tools=("search",), workspace_root="")
    assert [d["name"] for d in tool_definitions(job)] == ["search"]  # the prefix does not depend on it
    with pytest.raises(ToolError, match="no workspace to search"):
        StepTools(job, Sink()).run("search", {"query": "wet"})


def test_both_tools_are_listed_in_name_order_with_the_prefix_and_only_when_granted(ws: Path) -> None:
    job = step_job(ws, tools=("search", "read_file", "history"))
    assert StepTools(job, Sink()).names == ["history", "read_file", "search"]
    defs = tool_definitions(job)
    assert [d["name"] for d in defs] == ["history", "read_file", "search"]
    search = next(d for d in defs if d["name"] == "search")
    assert search["input_schema"]["required"] == ["query"]
    assert search["input_schema"]["properties"]["in"]["enum"] == ["knowledge", "storage", "memory", "state", "all"]
    history = next(d for d in defs if d["name"] == "history")
    assert "200 newest runs" in history["description"]
    assert [d["name"] for d in tool_definitions(step_job(ws, tools=("read_file",)))] == ["read_file"]
    with pytest.raises(ToolError, match="no tool 'search'"):
        StepTools(step_job(ws, tools=("read_file",)), Sink()).run("search", {"query": "wet"})


def test_check_knows_both_names_and_suggests_the_closest_for_a_misspelt_one() -> None:
    assert unknown_tools(["search", "history"], []) == []
    assert unknown_tools(["histroy"], []) == [(0, "histroy", "history")]


def prompt_layers(tmp_path: Path, tools: str) -> dict[str, str]:
    root = tmp_path / "ws"
    shutil.copytree(FIXTURES / "ws_ok", root)
    md = root / "agents" / "researcher" / "agent.md"
    md.write_text(md.read_text().replace("tools: [read_file]", f"tools: {tools}"))
    ws = load_workspace(root)
    prompt = build_system_prompt(ws, load_agent(ws, "researcher"), now=NOW)
    assert all(not layer.dynamic for layer in prompt.layers if layer.name == "finding")
    return {layer.name: layer.text for layer in prompt.layers}


def test_the_finding_layer_describes_the_granted_tools_only_stable_and_small(tmp_path: Path) -> None:
    both = prompt_layers(tmp_path / "both", "[read_file, search, history]")["finding"]
    assert "`search" in both and "`history" in both and len(both) < 700
    only_search = prompt_layers(tmp_path / "search", "[search]")["finding"]
    assert "`search" in only_search and "`history" not in only_search
    only_history = prompt_layers(tmp_path / "history", "[history]")["finding"]
    assert "`history" in only_history and "`search" not in only_history
    assert "finding" not in prompt_layers(tmp_path / "none", "[read_file]")
    later = build_system_prompt(
        load_workspace(tmp_path / "both" / "ws"),
        load_agent(load_workspace(tmp_path / "both" / "ws"), "researcher"),
        now=NOW + dt.timedelta(days=3),
    )
    assert next(layer.text for layer in later.layers if layer.name == "finding") == both  # the same text on another day


class Reads:
    """A store's reads as `history` makes them: each method's name and keyword arguments."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if not callable(found):
            return found

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return found(*args, **kwargs)

        return recorded


class StoreSink(Sink):
    def __init__(self, runs: Reads) -> None:
        super().__init__()
        self.runs = runs


def earlier_run(n: int, conclusion: str, *, workspace: str = "ws", tenant: str = "local") -> Run:
    at = (dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=n)).isoformat(timespec="milliseconds")
    step = Step(index=0, group=0, agent="scout", status=StepStatus.completed, conclusion=conclusion)
    return Run(
        id=f"run-{n:04d}", tenant=tenant, workspace=workspace, flow="scan", created_at=at.replace("+00:00", "Z"), steps=[step]
    )


def test_history_reads_only_the_200_newest_runs_through_the_run_list_and_each_runs_steps(ws: Path, tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        store.create_run(earlier_run(0, "the needle, oldest of all"))
        store.create_run(earlier_run(1, "another workspace's needle", workspace="elsewhere"))
        for n in range(2, 200):
            store.create_run(earlier_run(n, "hay"))
        store.create_run(earlier_run(9999, "the calling run's own needle"))
        reads = Reads(store)
        tools = FindingTools(step_job(ws, tools=("history",), run_id="run-9999"), StoreSink(reads))
        # The calling run, 198 of hay, the other workspace's and the oldest: 201 runs, one past the bound.
        assert tools.history({"query": "NEEDLE"}) == "no earlier run of this workspace concluded a line holding 'NEEDLE'"
        assert {name for name, _ in reads.calls} == {"get_run", "list_runs", "get_steps"}
        assert [kwargs for name, kwargs in reads.calls if name == "list_runs"] == [{"limit": MAX_RUNS}]
    finally:
        store.close()
    fresh = open_store(f"sqlite:///{tmp_path / 'few.db'}")
    try:
        fresh.create_run(earlier_run(0, "the needle, oldest of all"))
        fresh.create_run(earlier_run(1, "another workspace's needle", workspace="elsewhere"))
        fresh.create_run(earlier_run(9999, "the calling run's own needle"))
        tools = FindingTools(step_job(ws, tools=("history",), run_id="run-9999"), StoreSink(Reads(fresh)))
        assert tools.history({"query": "NEEDLE"}) == ("run-0000 2026-01-01T00:00:00.000Z step 0 scout: the needle, oldest of all")
    finally:
        fresh.close()
