"""The redactor, given any values and any text: what it returns never holds a value of 8
characters or more, nor any form `encodings` lists for it, however the value or its encoded
copy is embedded (inside other text, inside a longer base64 stream at any alignment, next to
other values, next to text that would make a value again once a mark is in); and text that
holds none of them comes back as it was."""

from __future__ import annotations

import base64
import threading

from hypothesis import assume, given
from hypothesis import strategies as st

from laneflow.domain.redaction import SAFE_MARK, Redactor, encodings

NAMES = st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True)
CHARS = st.characters(blacklist_categories=("Cs",))  # type: ignore[arg-type]
VALUES = st.text(CHARS, min_size=8, max_size=40)
TEXT = st.text(CHARS, max_size=30)


def forms(value: str) -> list[str]:
    return [form for form in encodings(value) if len(form) >= Redactor.MIN_LEN]


def left(redactor: Redactor, values: list[str], text: str) -> list[str]:
    """The forms of `values` still in what the redactor made of `text`."""
    masked = redactor(text)
    return [form for value in values for form in forms(value) if form in masked]


@given(NAMES, VALUES, st.data(), TEXT, TEXT)
def test_a_value_or_any_of_its_encodings_anywhere_in_text_is_masked(
    name: str, value: str, data: st.DataObject, before: str, after: str
) -> None:
    form = data.draw(st.sampled_from(encodings(value)))
    redactor = Redactor({name: value})
    masked = redactor(before + form + after)
    assert left(redactor, [value], before + form + after) == []
    assert f"[{name}]" in masked or SAFE_MARK in masked


@given(NAMES, VALUES, st.binary(max_size=5), st.binary(max_size=5), st.booleans())
def test_a_value_inside_a_longer_base64_stream_is_masked_at_every_alignment(
    name: str, value: str, before: bytes, after: bytes, url_safe: bool
) -> None:
    encode = base64.urlsafe_b64encode if url_safe else base64.b64encode
    stream = encode(before + value.encode() + after).decode()
    redactor = Redactor({name: value})
    masked = redactor(stream)
    assert left(redactor, [value], stream) == []
    assert f"[{name}]" in masked or SAFE_MARK in masked  # found, not merely absent
    # Of the value's copy, only the characters that share bits with its neighbours are left.
    n, k = len(value.encode()), len(before)
    own = (8 * (k + n)) // 6 - -(-8 * k // 6)  # the characters of the stream that only the value's bits decide
    assert len(masked.replace(f"[{name}]", "").replace(SAFE_MARK, "")) <= len(stream) - own


@given(st.dictionaries(NAMES, VALUES, min_size=1, max_size=4), st.lists(st.tuples(TEXT, st.integers(0, 3)), max_size=6))
def test_several_values_side_by_side_leave_no_form_of_any(values: dict[str, str], pieces: list[tuple[str, int]]) -> None:
    names, secrets = list(values), list(values.values())
    redactor = Redactor(values)
    text = "".join(piece + encodings(secrets[k % len(secrets)])[k % 4] for piece, k in pieces)
    assert left(redactor, secrets, text) == [], names


@given(NAMES, st.data(), TEXT, TEXT)
def test_a_value_that_is_part_of_its_own_mark_or_that_the_mark_completes_is_still_masked(
    name: str, data: st.DataObject, before: str, after: str
) -> None:
    # A value taken from `[NAME]` and the text beside it: replacing it can make it again.
    mark = f"[{name}]"
    start = data.draw(st.integers(0, len(mark) - 1))
    value = (mark[start:] + after + "tail-of-it")[:40]
    assume(len(value) >= 8)
    redactor = Redactor({name: value})
    for text in (before + value + after, value + value + after, mark[:start] + value + value[len(mark) - start :]):
        assert left(redactor, [value], text) == []


@given(st.dictionaries(NAMES, VALUES, max_size=3), TEXT)
def test_text_holding_no_value_comes_back_as_it_was(values: dict[str, str], text: str) -> None:
    redactor = Redactor(values)
    assume(not any(form in text for value in values.values() for form in forms(value)))
    assert redactor(text) == text


@given(NAMES, st.text(CHARS, max_size=7), TEXT)
def test_a_value_under_8_characters_is_never_masked(name: str, value: str, text: str) -> None:
    redactor = Redactor({name: value})
    assert not redactor and redactor(text + value) == text + value


def test_a_second_holder_waits_for_the_first_holders_values_and_the_last_release_drops_them() -> None:
    redactor = Redactor()
    loading, release_load = threading.Event(), threading.Event()
    calls: list[str] = []

    def load() -> dict[str, str]:
        calls.append("load")
        loading.set()
        release_load.wait(5)
        return {"TOKEN": "run-wide-value-0123"}

    first = threading.Thread(target=redactor.hold, args=("run:local/r1", load))
    first.start()
    assert loading.wait(5)
    seen: list[str] = []
    second = threading.Thread(target=lambda: (redactor.hold("run:local/r1", load), seen.append(redactor("run-wide-value-0123"))))  # type: ignore[func-returns-value]
    second.start()
    second.join(0.2)
    assert second.is_alive() and seen == []  # it waits: nothing it records goes out unmasked
    release_load.set()
    first.join(5)
    second.join(5)
    assert seen == ["[TOKEN]"] and calls == ["load"]  # loaded once, by the first holder
    redactor.release("run:local/r1")
    assert redactor("run-wide-value-0123") == "[TOKEN]"
    redactor.release("run:local/r1")
    assert redactor("run-wide-value-0123") == "run-wide-value-0123" and redactor.held() == []
    assert "run-wide-value-0123" not in repr(vars(redactor))


def test_a_load_that_raises_is_tried_again_by_the_next_holder() -> None:
    redactor = Redactor()

    def broken() -> dict[str, str]:
        raise OSError("the source is away")

    try:
        redactor.hold("run:local/r2", broken)
    except OSError:
        pass
    redactor.hold("run:local/r2", lambda: {"TOKEN": "second-try-value-42"})
    assert redactor("second-try-value-42") == "[TOKEN]"
    redactor.release("run:local/r2")
    redactor.release("run:local/r2")
    assert redactor.held() == []
