"""Delegation's rules (laneflow.domain.delegation): what an agent reaches within the depth
limit, and why a call is refused; property tests over arbitrary delegation graphs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from laneflow.domain.delegation import MAX_DEPTH, reach, reach_options, refusal

NAMES = st.sampled_from(["a", "b", "c", "d", "e"])
GRAPHS = st.dictionaries(NAMES, st.lists(NAMES, max_size=4), max_size=5)


def test_reach_stops_at_the_depth_limit_and_never_includes_the_agent_itself() -> None:
    graph = {"a": ["b"], "b": ["c", "a"], "c": ["d"], "d": ["e"]}
    assert reach("a", lambda n: graph.get(n, [])) == ["b", "c"]  # d is three deep
    assert reach_options(graph) == {"a": ["b", "c"], "b": ["c", "a", "d"], "c": ["d", "e"], "d": ["e"]}


def test_each_refusal_says_why() -> None:
    assert refusal(("a",), "b", ("b",)) is None
    assert refusal(("a", "b"), "c", ("c",)) is None
    assert "only to" in (refusal(("a",), "z", ("b",)) or "")
    assert "itself" in (refusal(("a",), "a", ("a",)) or "")
    assert "above b" in (refusal(("a", "b"), "a", ("a",)) or "")
    assert f"at most {MAX_DEPTH} deep" in (refusal(("a", "b", "c"), "d", ("d",)) or "")


@given(GRAPHS, NAMES)
def test_what_an_agent_reaches_is_within_the_depth_and_never_itself(graph: dict[str, list[str]], start: str) -> None:
    reached = reach(start, lambda n: graph.get(n, []))
    assert start not in reached and len(reached) == len(set(reached))
    within = {start}
    for _ in range(MAX_DEPTH):
        within |= {t for n in within for t in graph.get(n, [])}
    assert set(reached) == within - {start}


@given(st.lists(NAMES, min_size=1, max_size=5), NAMES, st.lists(NAMES, max_size=5))
def test_a_call_is_allowed_only_down_a_granted_edge_within_the_depth(chain: list[str], target: str, granted: list[str]) -> None:
    why = refusal(tuple(chain), target, tuple(granted))
    allowed = target in granted and target not in chain and len(chain) <= MAX_DEPTH
    assert (why is None) == allowed
