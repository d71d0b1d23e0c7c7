"""`--input`, given anything: accepted and then kept by the store exactly as read, or refused
with `InvalidInput` naming `--input`; never another exception."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneflow.adapters.store import Store, open_store
from laneflow.domain.errors import InvalidInput
from laneflow.domain.records import Run, Step
from laneflow.entrypoints.cli import parse_input

# Text as Python can hold it: lone surrogates included (an argv that was not UTF-8 arrives
# with them), next to ordinary text.
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "é", "😀"]),
)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=10**90, max_value=10**130),
    st.floats(allow_nan=True, allow_infinity=True),
)
VALUES = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=16,
)


@st.composite
def json_ish(draw: st.DrawFn) -> str:
    """JSON text as Python writes it (NaN and Infinity included), sometimes mangled."""
    text = json.dumps(draw(VALUES), allow_nan=True, ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 3))
        insert = draw(st.sampled_from(["", "NaN", "-Infinity", "1e999", "\\ud800", '"', "[", "{", ",", "9" * 400]))
        text = text[:at] + insert + text[at + cut :]
    return text


NESTED = st.builds(
    lambda depth, opener: opener[0] * depth + "1" + opener[1] * depth,
    st.integers(0, 300),
    st.sampled_from([("[", "]"), ('{"a":', "}")]),
)


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    store = open_store("sqlite:///:memory:")  # the same SQL and JSON functions, no disk
    yield store
    store.close()


def accepted_or_refused_naming_input(store: Store, text: str) -> None:
    try:
        value = parse_input(text)
    except InvalidInput as refused:
        assert str(refused).startswith("--input"), str(refused)
        return
    # Accepted: the store keeps it, and gives back exactly what was read.
    run = Run(
        id=f"run-{uuid.uuid4().hex[:12]}",
        tenant="local",
        workspace="w",
        flow="f",
        input=value,
        steps=[Step(index=0, group=0, agent="a", item=value)],
    )
    store.create_run(run)
    back = store.get_run("local", run.id)
    assert back.input == value and back.steps[0].item == value
    assert run.id in {r.id for r in store.list_runs("local", limit=500)}


@given(json_ish())
def test_json_ish_input_is_accepted_and_round_trips_or_is_refused_naming_input(store: Store, text: Any) -> None:
    accepted_or_refused_naming_input(store, text)


@given(st.text(max_size=60))
def test_arbitrary_text_as_input_is_accepted_and_round_trips_or_is_refused_naming_input(store: Store, text: str) -> None:
    accepted_or_refused_naming_input(store, text)


@given(NESTED)
def test_nested_input_is_accepted_within_the_bound_or_refused_naming_input(store: Store, text: Any) -> None:
    accepted_or_refused_naming_input(store, text)


@given(json_ish())
def test_input_from_a_file_is_accepted_or_refused_naming_the_file(tmp_path_factory: pytest.TempPathFactory, text: Any) -> None:
    path = Path(tmp_path_factory.mktemp("in")) / "in.json"
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))  # lone surrogates as bytes no UTF-8 reader takes
    try:
        parse_input(f"@{path}")
    except InvalidInput as refused:
        assert str(refused).startswith(f"--input file {path}"), str(refused)


# -- repeated keys ---------------------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "", "é", "\\u00e9", "a b"])  # few, so objects often repeat one


@st.composite
def written(draw: st.DrawFn, depth: int = 0) -> tuple[str, set[str]]:
    """JSON text written pair by pair (a key may be given twice, as `json.dumps` never
    writes it) and the keys some object of it repeats (as read: `"\\u00e9"` is `"é"`)."""
    kind = draw(st.integers(0, 2 if depth < 3 else 0))
    if kind == 0:
        return json.dumps(draw(st.none() | st.booleans() | st.integers() | st.text(max_size=4))), set()
    if kind == 1:
        items = [draw(written(depth + 1)) for _ in range(draw(st.integers(0, 3)))]
        return "[" + ", ".join(text for text, _ in items) + "]", set().union(*(r for _, r in items))
    seen: set[Any]
    pairs, seen, repeated = [], set(), set()
    for _ in range(draw(st.integers(0, 4))):
        key = draw(KEYS)
        name = json.loads(f'"{key}"')
        repeated |= {name} & seen
        seen.add(name)
        text, inner = draw(written(depth + 1))
        pairs.append(f'"{key}": {text}')
        repeated |= inner
    return "{" + ", ".join(pairs) + "}", repeated


@given(written())
def test_json_with_a_repeated_key_is_refused_naming_it_and_without_one_reads_as_json_loads(store: Store, given_text: Any) -> None:
    text, repeated = given_text
    if not repeated:
        assert parse_input(text) == json.loads(text)
        accepted_or_refused_naming_input(store, text)
        return
    with pytest.raises(InvalidInput) as refused:
        parse_input(text)
    said = str(refused.value)
    assert said.startswith("--input: $") and "is given twice in one object" in said, said
    assert any(f"the key {json.dumps(key)} is given twice" in said for key in repeated), said
