"""agent.md `network:` (domain/network.py): what an entry may be, the problems `laneflow check`
reports for a bad one (file, line and field), and matching a destination against the list:
exactly the listed host and port, `*.x` for subdomains only, case-insensitive, a trailing
dot ignored. Property tests: no entry crashes the parser; a wildcard matches a subdomain
and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import write_workspace
from hypothesis import given
from hypothesis import strategies as st

from laneflow.domain.flow import check_workspace
from laneflow.domain.network import Allowlist, BadEntry, Destination, parse_entry, parse_network
from laneflow.domain.workspace import load_agent, load_workspace

FLOW = {"one": {"description": "d", "steps": [{"agent": "a"}]}}


def problems_of(tmp_path: Path, settings: dict[str, Any]) -> list[Any]:
    ws = write_workspace(tmp_path / "ws", {"a": settings}, FLOW)
    return [p for p in check_workspace(ws) if p.severity == "error"]


# -- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "parsed"),
    [
        ("pypi.org", Destination("pypi.org")),
        ("PyPI.org.", Destination("pypi.org")),
        ("127.0.0.1:8080", Destination("127.0.0.1", 8080)),
        ("*.github.com", Destination("github.com", None, wildcard=True)),
        ("*.GitHub.com:8443", Destination("github.com", 8443, wildcard=True)),
        ("[::1]:8080", Destination("::1", 8080)),
        ("[0:0::1]", Destination("::1")),
        ("files_host.internal:1", Destination("files_host.internal", 1)),
    ],
)
def test_an_entry_is_a_host_or_host_port_normalised(written: str, parsed: Destination) -> None:
    assert parse_entry(written) == parsed


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("https://pypi.org", "no scheme"),
        ("pypi.org/simple", "no path"),
        ("pypi.org:0", "out of range"),
        ("pypi.org:65536", "out of range"),
        ("pypi.org:http", "not a number"),
        ("api.*.github.com", "only at the start"),
        ("*github.com", "only at the start"),
        ("*", "only at the start"),
        ("*.", "no host"),
        ("*.127.0.0.1", "not an address"),
        ("::1", "in brackets"),
        ("[::1", "never closes"),
        ("[pypi.org]", "not an IPv6"),
        ("user@pypi.org", "no spaces, user"),
        ("py pi.org", "no spaces"),
        ("-bad-.org", "not a host name"),
        ("a..b", "not a host name"),
        (8080, "got a number"),
    ],
)
def test_a_bad_entry_says_why(written: Any, says: str) -> None:
    with pytest.raises(BadEntry, match=says):
        parse_entry(written)


def test_none_and_absent_are_no_network_and_a_list_keeps_each_destination_once() -> None:
    assert parse_network(None) == ((), []) and parse_network("none") == ((), [])
    found, problems = parse_network(["pypi.org", "PYPI.ORG", "", "a.org:99999"])
    assert found == (Destination("pypi.org"),)
    assert [index for index, _ in problems] == [2, 3]
    assert parse_network("everything")[1] == [(None, "expected none or a list of host / host:port entries, got a string")]


@given(st.one_of(st.text(max_size=80), st.integers(), st.none(), st.lists(st.text(max_size=20), max_size=5)))
def test_no_entry_crashes_the_parser(entry: Any) -> None:
    try:
        destination = parse_entry(entry)
    except BadEntry:
        return
    assert parse_entry(destination.text()) == destination  # what it says reads back as itself
    parse_network([entry, entry])


# -- matching -------------------------------------------------------------------------------


def test_exactly_the_listed_host_and_port_pass_and_a_host_alone_means_80_and_443() -> None:
    allow = Allowlist.parse(["127.0.0.1:8080", "pypi.org"])
    assert allow.allows("127.0.0.1", 8080) and not allow.allows("127.0.0.1", 8081) and not allow.allows("127.0.0.2", 8080)
    assert allow.allows("pypi.org", 443) and allow.allows("pypi.org", 80) and not allow.allows("pypi.org", 8443)
    assert not allow.allows("files.pypi.org", 443)  # a listed host is not its subdomains
    assert not Allowlist().allows("pypi.org", 443) and Allowlist().describe() == "none"


_LABEL = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)  # a name, never an address
_NAME = st.lists(_LABEL, min_size=1, max_size=4).map(".".join)


@given(domain=_NAME, host=_NAME, port=st.sampled_from([80, 443]))
def test_a_host_matches_a_wildcard_only_when_it_is_a_subdomain(domain: str, host: str, port: int) -> None:
    allow = Allowlist.parse([f"*.{domain}"])
    assert allow.allows(host, port) == host.endswith("." + domain)
    assert not allow.allows(domain, port)  # never the bare domain
    assert allow.allows(f"{host}.{domain}", port)


@given(host=_NAME, port=st.integers(1, 65535), data=st.data())
def test_matching_ignores_case_and_a_trailing_dot(host: str, port: int, data: st.DataObject) -> None:
    flipped = "".join(c.upper() if data.draw(st.booleans()) else c for c in host)
    dotted = flipped + ("." if data.draw(st.booleans()) else "")
    assert Allowlist.parse([f"{host}:{port}"]).allows(dotted, port)
    assert Allowlist.parse([f"{dotted}:{port}"]).allows(host, port)
    assert Allowlist.parse([f"*.{dotted}:{port}"]).allows(f"www.{host}", port)
    assert not Allowlist.parse([f"{host}:{port}"]).allows(host, port % 65535 + 1)


# -- laneflow check -------------------------------------------------------------------------


def test_check_names_file_line_and_field_of_each_bad_entry(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, {"tools": ["bash"], "network": ["pypi.org", "https://x.org", "*.ok.org", "a.*.b"]})
    assert [(p.file, p.field) for p in problems] == [("agents/a/agent.md", "network[1]"), ("agents/a/agent.md", "network[3]")]
    assert all(p.line for p in problems) and problems[0].line != problems[1].line
    assert "no scheme" in problems[0].message and "only at the start" in problems[1].message


def test_a_list_on_an_agent_that_runs_no_program_and_is_not_sandboxed_would_be_ignored(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, {"tools": ["read_file"], "network": ["pypi.org"]})
    assert problem.field == "network" and "would be ignored" in problem.message and problem.line
    assert problems_of(tmp_path / "b", {"sandbox": True, "network": ["pypi.org"]}) == []
    assert problems_of(tmp_path / "c", {"network": "none"}) == []


@pytest.mark.parametrize("value", [5, "all", {"host": "pypi.org"}])
def test_network_that_is_neither_none_nor_a_list_is_one_problem(tmp_path: Path, value: Any) -> None:
    [problem] = problems_of(tmp_path, {"tools": ["bash"], "network": value})
    assert problem.field == "network" and problem.line


def test_the_agent_carries_its_checked_destinations(tmp_path: Path) -> None:
    write_workspace(tmp_path / "ws", {"a": {"tools": ["bash"], "network": ["PyPI.org.", "127.0.0.1:8080", "pypi.org"]}}, FLOW)
    agent = load_agent(load_workspace(tmp_path / "ws"), "a")
    assert agent.network == ["pypi.org", "127.0.0.1:8080"]
    assert load_agent(load_workspace(tmp_path / "ws"), "a").settings.network is not None


def test_beside_a_tools_setting_of_the_wrong_type_the_list_is_not_called_ignored(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, {"tools": "bash", "network": ["pypi.org"]})
    assert problem.field == "tools"
