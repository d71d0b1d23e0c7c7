"""An API tool's call input (`{method, path, query, body}`), given anything JSON can hold: it is
parsed, or refused with `CallInvalid`; never another exception. Whatever URL a parsed call
resolves to is on the API's own scheme, host and port, under its base path, with nothing in it
that would split a request line. An `apis:` entry of any shape is checked into problems,
never an exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneflow.domain.apis import CallInvalid, check_apis, origin, parse_call, read_operations, target_url

BASES = st.sampled_from(
    ["http://127.0.0.1:8080/api/v1", "https://api.example.com", "https://api.example.com/v2/", "http://h:81/a/b"]
)

PATHS = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "/",
            "",
            "..",
            "../x",
            "/%2e%2e/x",
            "/%2E%2e%2fetc",
            "//evil.com/x",
            "http://evil.com/",
            "https://api.example.com/x",
            "http://127.0.0.1:8080/api/v1/x",
            "http://127.0.0.1:8081/api/v1",
            "HTTP://API.EXAMPLE.COM/x",
            "/a/../../b",
            "/x?y=1#z",
            "\\\\evil.com\\x",
            "/a b",
            "/\u00e9",
            "items:42",
            "http://[::1]/",
            "http://a:99999/",
            "/x\r\nHost: evil",
            "%",
            "/%zz",
            "javascript:alert(1)",
            "/./././",
            "/api/v1/../../..",
        ]
    ),
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)

CALLS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "method": st.sampled_from(["GET", "post", "DELETE", "TRACE", "", "get "]) | JSON,
            "path": PATHS | JSON,
            "query": st.dictionaries(st.text(max_size=5), JSON, max_size=3) | JSON,
            "body": JSON,
        },
    ),
)


@given(BASES, CALLS)
def test_any_call_input_is_parsed_or_refused_and_never_reaches_past_its_base_url(base: str, args: Any) -> None:
    try:
        call = parse_call(args)
        url = target_url(base, call)
    except CallInvalid as error:
        assert str(error)
        return
    assert origin(url) == origin(base)
    path = urlsplit(url).path
    base_path = urlsplit(base).path.rstrip("/") + "/"
    assert (path + "/").startswith(base_path)
    assert "/../" not in path + "/" and "/./" not in path + "/"
    assert not any(c in url for c in " \r\n\t\x00\\#")


ENTRY = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["tracker", "a b", "", "x" * 70]) | JSON,
            "base_url": st.sampled_from(
                ["https://x.example.com", "ftp://x", "http://", "http://u:p@h", "http://h?x", "http://h:99999"]
            )
            | JSON,
            "headers": st.dictionaries(
                st.sampled_from(["X-Token", "a b", ""]),
                st.sampled_from(["${TOKEN}", "${NOPE}", "v\r\n", "${@X}"]) | JSON,
                max_size=3,
            )
            | JSON,
            "openapi": st.sampled_from(["api.json", "../x", "/etc/passwd", "", "missing.yaml"]) | JSON,
            "extra": JSON,
        },
    ),
)


@given(st.lists(ENTRY, max_size=3) | JSON)
def test_any_apis_entry_is_checked_into_problems_never_an_exception(raw: Any) -> None:
    specs, problems = check_apis(
        raw, rel="agents/a/agent.md", agent_dir=Path("/nonexistent/agents/a"), lines={"apis": 2}, secrets=["TOKEN"]
    )
    assert all(p.file == "agents/a/agent.md" and p.field and p.field.startswith("apis") for p in problems)
    if raw is not None and not problems:
        assert isinstance(raw, list) and len(specs) == len(raw)


OPENAPI = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            "paths: {}",
            "paths: []",
            "paths:\n  /x:\n    get: {summary: 1}\n",
            "paths:\n  /x: [1]\n",
            "openapi: 3\npaths:\n  /x:\n    post: ~\n    x-y: 1\n",
            '{"paths": {"/a": {"get": {"description": "\\n"}}}}',
            "[",
            "{",
            ".inf",
            "a: *b",
            "\ufeffpaths: {}",
            "paths:\n  1: {get: {}}\n",
        ]
    ),
)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
@given(text=OPENAPI)
def test_any_openapi_file_gives_operations_or_a_reason_never_an_exception(
    tmp_path_factory: pytest.TempPathFactory, suffix: str, text: str
) -> None:
    path = tmp_path_factory.mktemp("openapi") / f"api{suffix}"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    operations, problem = read_operations(path)
    assert (operations == []) if problem else all(op.method and isinstance(op.path, str) for op in operations)
