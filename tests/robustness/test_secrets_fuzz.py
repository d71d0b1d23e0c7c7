"""A secrets file and an agent's `secrets:`, given anything: read, or refused with
`InvalidInput` whose message never quotes what the file holds; never another exception.
What a file written by a person's tools (`NAME="value"` with any value) holds reads back
exactly."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from laneflow.adapters.local.secrets import parse_dotenv
from laneflow.domain.errors import InvalidInput
from laneflow.domain.secrets import declared_secrets

MARK = "Zq9"  # in every line drawn: a refusal that quoted the file would show it

LINES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(['A="', "A='", 'A="x" y', "export", "=v", "A=b # c", "# c", 'B="a\\"b"', "\ufeffC=d"]),
)


@given(st.lists(LINES, max_size=8))
def test_a_secrets_file_of_any_text_is_read_or_refused_without_quoting_it(lines: list[str]) -> None:
    text = "\n".join(MARK + line for line in lines)
    try:
        values = parse_dotenv(text, "the --secrets file")
    except InvalidInput as error:
        assert MARK not in str(error) and str(error).startswith("the --secrets file, line ")
    else:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in values.items())


NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
VALUES = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),  # type: ignore[arg-type]
    max_size=40,
) | st.sampled_from(["a  \n  b", " lead", "trail  ", "\n", "x\n\ny  "])


@given(st.dictionaries(NAMES, VALUES, max_size=6))
def test_double_quoted_values_read_back_exactly(values: dict[str, str]) -> None:
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") for k, v in values.items()}
    text = "".join(f'{k}="{v}"\n' for k, v in escaped.items())
    assert parse_dotenv(text, "f") == values


@given(st.lists(st.one_of(st.text(max_size=12), NAMES, NAMES.map(lambda n: "@" + n)), max_size=6))
def test_any_secrets_list_is_read_or_refused_as_bad_input(entries: Any) -> None:
    try:
        found = declared_secrets(entries, agent="a")
    except InvalidInput as error:
        assert str(error).startswith("secrets of agent a: ")
    else:
        assert len({s.name for s in found}) == len(found) == len(entries)
