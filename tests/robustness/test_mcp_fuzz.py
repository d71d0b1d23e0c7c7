"""An `mcp:` of any shape (agent.md or AGENTS.md) is checked into problems, never an
exception; every refusal names the file and a field under `mcp`; an `mcp:` with no
problem gives one server for each entry."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from laneflow.domain.mcp import check_mcp, tool_name

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)

VALUES = st.dictionaries(
    st.sampled_from(["TOKEN", "X-Key", "a b", "", "1X"]),
    st.sampled_from(["${TOKEN}", "${NOPE}", "${CERT}", "v\r\n", "plain", "\x00"]) | JSON,
    max_size=3,
)

ENTRY = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["echo", "a b", "", "x" * 50, "a.b", "a_b"]) | JSON,
            "command": st.sampled_from(["python3", "", " ", "/bin/x\x00"]) | JSON,
            "args": st.lists(st.sampled_from(["-v", "${TOKEN}", "\x00"]), max_size=3) | JSON,
            "env": VALUES | JSON,
            "url": st.sampled_from(["https://h/mcp", "ftp://x", "http://", "http://u:p@h", "http://h#f", "http://h:99999"])
            | JSON,
            "headers": VALUES | JSON,
            "comand": JSON,
        },
    ),
)


@given(st.lists(ENTRY, max_size=3) | JSON, st.sampled_from([None, ["TOKEN", "@CERT"], [], "TOKEN", [3]]))
def test_any_mcp_value_is_checked_into_problems_never_an_exception(raw: Any, secrets: Any) -> None:
    servers, problems = check_mcp(raw, rel="agents/a/agent.md", lines={"mcp": 2}, secrets=secrets)
    assert all(p.file == "agents/a/agent.md" and p.field and p.field.startswith("mcp") and p.message for p in problems)
    if raw is not None and not problems:
        assert isinstance(raw, list) and len(servers) == len(raw)
        names = [tool_name(s.name, "t") for s in servers]
        assert len(set(names)) == len(names)
