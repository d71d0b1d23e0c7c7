"""The stub's web lines (`tool: web_search {...}`, `tool: web_fetch {...}`): whatever follows
the name, the parser and the pretend result never crash; a granted tool's line is answered
with pages naming its query or URL, counted against `web_max_uses` a turn, and recorded as a
server tool use is."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from laneflow.adapters.executors.registry import StepTools, tool_definitions
from laneflow.adapters.executors.stub import StubExecutor
from laneflow.adapters.executors.web import WebTools, citations_of, uses_of
from laneflow.domain.records import EventType, ModelCall
from laneflow.domain.stub_answers import PretendWeb, parse_answer, pretend_web
from laneflow.ports import StepInbox, StepJob

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


class Sink:
    inbox: StepInbox | None = None

    def __init__(self) -> None:
        self.tools: list[tuple[str, str, str, bool]] = []
        self.events: list[tuple[EventType, str, dict[str, Any] | None]] = []
        self.calls: list[ModelCall] = []

    def first_event(self) -> None: ...

    def begin_turn(self) -> None: ...

    def prefix_uncacheable(self, tokens: int, minimum: int) -> None: ...

    def call(self, span: ModelCall) -> ModelCall:
        self.calls.append(span)
        return span

    def event(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((type, text, data))

    def tool_call(self, name: str, tool_input: str, tool_output: str, *, ms: int = 0, is_error: bool = False) -> None:
        self.tools.append((name, tool_input, tool_output, is_error))

    def stopped(self) -> bool:
        return False


def job(tools: tuple[str, ...] = ("web_search", "web_fetch"), stub: str = "Done.", web_max_uses: int = 5) -> StepJob:
    return StepJob(
        tenant="local",
        run_id="r1",
        index=0,
        attempt=1,
        agent="scout",
        model="stub",
        item=None,
        run_input={},
        system_stable="You scout.",
        system_dynamic="",
        user="Scout.",
        tools=tools,
        stub=stub,
        web_max_uses=web_max_uses,
    )


@given(value=JSON, tool=st.sampled_from(["web_search", "web_fetch"]))
def test_any_json_after_a_web_tool_name_never_crashes_the_stub_parser(value: Any, tool: str) -> None:
    text = json.dumps(value)  # ASCII: no line separator inside it
    answer = parse_answer(f"tool: {tool} {text}\nDone.")
    [turn] = answer.turns
    [call] = turn.calls
    assert call.real and call.tool == tool and call.input == text.strip()
    result = pretend_web(tool, call.input)
    assert isinstance(result, PretendWeb) and (result.error is None) == bool(result.pages)
    if isinstance(value, dict) and isinstance(value.get("query" if tool == "web_search" else "url"), str):
        return
    assert result.error == "invalid_tool_input"  # not what the tool takes


@given(raw=st.text(max_size=300), tool=st.sampled_from(["web_search", "web_fetch"]))
def test_any_text_after_a_web_tool_name_is_a_result_or_the_apis_error_code(raw: str, tool: str) -> None:
    sink = Sink()
    output = WebTools(job()).pretend(tool, raw, sink)
    [(name, _, recorded, is_error)] = sink.tools
    assert name == tool and recorded == output and is_error == output.startswith("error: ")


def test_a_search_names_its_query_and_a_fetch_its_url_deterministically() -> None:
    search = pretend_web("web_search", '{"query": "spring tides"}')
    assert search == pretend_web("web_search", '{"query": "spring tides"}')
    assert search.pages == (
        ("Pretend result 1 for spring tides", "https://example.com/web-search/1?q=spring%20tides"),
        ("Pretend result 2 for spring tides", "https://example.com/web-search/2?q=spring%20tides"),
    )
    assert pretend_web("web_fetch", '{"url": "https://example.com/a"}').pages == (
        ("Pretend page at https://example.com/a", "https://example.com/a"),
    )
    assert pretend_web("web_fetch", '{"url": "ftp://example.com/a"}').error == "invalid_tool_input"
    assert pretend_web("web_fetch", json.dumps({"url": "https://example.com/" + "a" * 300})).error == "url_too_long"
    assert pretend_web("web_search", '{"query": "  "}').error == "invalid_tool_input"
    assert pretend_web("web_search", '{"query": "a", "query": "b"}').error == "invalid_tool_input"  # a key twice


def test_the_stub_answers_granted_web_lines_counts_them_a_turn_and_prices_its_searches() -> None:
    stub = "\n".join(
        [
            'tool: web_search {"query": "one"}',
            'tool: web_search {"query": "two"}',  # past web_max_uses (1)
            'tool: web_fetch {"url": "https://example.com/one"}',
            "Looked.",
            "===",
            'tool: web_search {"query": "three"}',
            "Done.",
        ]
    )
    sink = Sink()
    outcome = StubExecutor(slice_s=0.001).execute(job(stub=stub, web_max_uses=1), sink)
    assert [(name, is_error) for name, _, _, is_error in sink.tools] == [
        ("web_search", False),
        ("web_search", True),
        ("web_fetch", False),
        ("web_search", False),
    ]
    assert sink.tools[1][2] == "error: max_uses_exceeded"
    webs = [data for _, _, data in sink.events if data and "web_search_requests" in data]
    assert [(d["web_search_requests"], d["web_fetch_requests"], d["cost_usd"]) for d in webs] == [(1, 1, 0.01), (1, 0, 0.01)]
    assert [c.cost_usd for c in sink.calls] == [0.01, 0.01] and outcome.cost_usd == 0.02


def test_the_definitions_carry_max_uses_in_the_stable_order_and_fetch_its_beta() -> None:
    both = job(tools=("read_file", "web_search", "web_fetch"), web_max_uses=3)
    defs = tool_definitions(both)
    assert [d["name"] for d in defs] == sorted(d["name"] for d in defs)
    assert {"type": "web_search_20250305", "name": "web_search", "max_uses": 3} in defs
    assert {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 3, "citations": {"enabled": True}} in defs
    assert WebTools(both).betas == ["web-fetch-2025-09-10"]
    assert WebTools(job(tools=("web_search",))).betas == []
    assert WebTools(job(tools=("read_file",))).definitions() == []
    assert StepTools(both, Sink()).names.count("web_search") == 1


def test_a_turns_uses_pair_with_their_results_and_its_citations_are_read() -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"query": "q"}},
        {
            "type": "web_search_tool_result",
            "tool_use_id": "s1",
            "content": [{"type": "web_search_result", "title": "T", "url": "https://a.example/", "encrypted_content": "e"}],
        },
        {"type": "server_tool_use", "id": "s2", "name": "web_fetch", "input": {"url": "https://b.example/"}},
        {
            "type": "web_fetch_tool_result",
            "tool_use_id": "s2",
            "content": {"type": "web_fetch_tool_result_error", "error_code": "url_not_accessible"},
        },
        {"type": "server_tool_use", "id": "s3", "name": "web_search", "input": {"query": "paused"}},
        {
            "type": "text",
            "text": "Said.",
            "citations": [
                {
                    "type": "web_search_result_location",
                    "url": "https://a.example/",
                    "title": "T",
                    "cited_text": "c",
                    "encrypted_index": "i",
                }
            ],
        },
    ]
    uses = uses_of(blocks)
    assert [(u.name, u.pages, u.error, u.answered) for u in uses] == [
        ("web_search", [("T", "https://a.example/")], None, True),
        ("web_fetch", [], "url_not_accessible", True),
        ("web_search", [], None, False),
    ]
    assert [u.summary() for u in uses] == ["1. T\n   https://a.example/", "error: url_not_accessible", "no result in this turn"]
    assert citations_of(blocks) == [
        {"type": "web_search_result_location", "url": "https://a.example/", "title": "T", "cited_text": "c"}
    ]
