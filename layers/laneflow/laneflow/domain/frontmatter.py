"""Reading YAML that people write: Markdown frontmatter (strict first, then leniently for
the one mistake everyone makes) and the strict loader flows are read with too.

`StrictLoader` refuses, with the value's line, what would crash or poison later (a nesting
too deep, an integer too long, `.inf`, a lone surrogate). `read_front` reads a Markdown
file's frontmatter strictly; frontmatter that fails only because a plain value contains
`: ` is read again with such values quoted, and each one comes back as a warning. Every
problem names the file and line.

`unreadable` finds, in a composed document, every value that cannot be constructed (a date
that is no date, `2001-13-45`; a tag nothing constructs) and every key given twice in one
mapping, each with its field; the reader lists them all as problems rather than stopping
at the first (or taking the last of a repeated key without a word).
"""

from __future__ import annotations

import copy
import math
import re
import threading
import typing
from collections import OrderedDict
from pathlib import Path
from typing import Any

import frontmatter
import yaml
from frontmatter.default_handlers import YAMLHandler

from laneflow.domain import jsonsafe
from laneflow.domain.errors import Problem, WorkspaceInvalid

__all__ = [
    "Front",
    "StrictLoader",
    "Unreadable",
    "UnfitValue",
    "read_front",
    "read_frontmatter",
    "read_text",
    "type_name",
    "unreadable",
    "within",
    "yaml_error_at",
]


class Front(typing.NamedTuple):
    data: dict[str, Any]
    body: str
    warnings: list[Problem]
    lines: dict[str, int]  # top-level key -> line in the file (a list's items as `key[i]`, their keys `key[i].k.k`)
    text_lines: dict[str, int] = {}  # a block scalar's field -> the line its text starts on
    errors: list[Problem] = []  # values that cannot be constructed, keys given twice (`unreadable`); left out of `data`


class UnfitValue(yaml.MarkedYAMLError):
    """YAML that parses but holds a value laneflow does not take (see `StrictLoader`)."""


class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing with the value's line what would crash or poison later:

    - nesting deeper than `jsonsafe.MAX_DEPTH` (the composer recurses: 3,000 levels exhaust
      the stack);
    - integers of more than `jsonsafe.MAX_DIGITS` digits (past 4,300 Python refuses them
      with a ValueError, not a YAML error);
    - `.inf` and `.nan` (no setting or JSON value can hold them);
    - text holding a lone surrogate (`"\\ud800"`), which is not a character and cannot be
      stored;
    - any value whose constructor fails with something other than a YAML error (PyYAML
      builds `2001-13-45` as a date and lets `datetime`'s ValueError out): an `UnfitValue`
      at the value's line, never a traceback.

    Workspace frontmatter and flows are read with it."""

    _depth = 0

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML leaves its bookkeeping as it was when a constructor raises; it is put back,
        # so the same loader can go on (`unreadable` tries each value on its own).
        deep_before, added = self.deep_construct, node not in self.recursive_objects
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            self._unwind(node, deep_before, added)
            raise
        except Exception as e:  # a constructor's own failure: the value, not the reader
            self._unwind(node, deep_before, added)
            raise UnfitValue(None, None, _not_constructed(node, e), node.start_mark) from None

    def _unwind(self, node: yaml.Node, deep_before: bool, added: bool) -> None:
        self.deep_construct = deep_before
        if added:
            self.recursive_objects.pop(node, None)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > jsonsafe.MAX_DEPTH:
                # types-PyYAML leaves Parser.peek_event unannotated
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise UnfitValue(None, None, f"nested deeper than {jsonsafe.MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = len(str(node.value).replace("_", "").lstrip("+-"))
        if digits > jsonsafe.MAX_DIGITS:
            raise UnfitValue(None, None, f"a number of {digits} digits; at most {jsonsafe.MAX_DIGITS} are taken", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            shown = node.value if len(node.value) <= 30 else node.value[:30] + "…"
            raise UnfitValue(None, None, f"{shown!r} is not a finite number", node.start_mark)
        return value

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        value = super().construct_yaml_str(node)
        found = jsonsafe.refusal(value)
        if found is not None:
            raise UnfitValue(None, None, found.reason, node.start_mark)
        return value


_KINDS = {"timestamp": "a date", "int": "a number", "float": "a number", "bool": "true/false", "binary": "base64 data"}

_STR_TAG = "tag:yaml.org,2002:str"

_MERGE_TAG = "tag:yaml.org,2002:merge"


def _not_constructed(node: yaml.Node, error: Exception) -> str:
    """Why a value could not be built, in one line: what it was written as, and what it is not."""
    kind = str(node.tag).rsplit(":", 1)[-1]
    if isinstance(node, yaml.ScalarNode):
        shown = node.value if len(node.value) <= 30 else node.value[:30] + "…"
        why = f" ({str(error)[:80]})" if isinstance(error, (ValueError, OverflowError)) else ""  # not an AttributeError's words
        return f"{shown!r} is not {_KINDS.get(kind, kind)}{why}; quote it to keep it as text"
    return f"a {kind} that cannot be built ({str(error)[:80]})"


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)

StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)

StrictLoader.add_constructor("tag:yaml.org,2002:str", StrictLoader.construct_yaml_str)


class Unreadable(typing.NamedTuple):
    """A value of a document that cannot be taken: its field (`key`, `key[i]`, `key.inner`;
    "" for the document itself), its node (the line is its mark's) and why."""

    field: str
    node: yaml.Node
    message: str


def unreadable(loader: StrictLoader, root: yaml.Node | None) -> list[Unreadable]:
    """Every value of a composed document that cannot be constructed, and every key given
    twice in one mapping, in file order.

    Each scalar is constructed on its own (a mapping's failure would hide its siblings');
    one that fails is then tagged as text, so the document constructs and the rest of it
    can be checked (the caller refuses the file with these problems whatever else it finds).
    A node reached twice (a YAML alias) is looked at once, so an alias bomb costs its nodes,
    not its expansion."""
    found: list[Unreadable] = []
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    while todo:
        node, field = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            _try_scalar(loader, node, field, found)
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((item, f"{field}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            keys: set[Any] = set()
            for key_node, value_node in node.value:
                name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                inner = f"{field}.{name}" if field else name
                if not isinstance(key_node, yaml.ScalarNode):
                    todo.append((key_node, inner))
                elif key_node.tag != _MERGE_TAG and _try_scalar(loader, key_node, inner, found):
                    key = loader.construct_object(key_node)
                    if key in keys:  # as a dict would take it: `1` and `0x1` are one key
                        found.append(Unreadable(inner, key_node, f"key {name!r} is given twice"))
                    keys.add(key)
                todo.append((value_node, inner))
    return sorted(found, key=lambda u: (u.node.start_mark.line, u.node.start_mark.column))


def _try_scalar(loader: StrictLoader, node: yaml.ScalarNode, field: str, found: list[Unreadable]) -> bool:
    """Construct one scalar; if it cannot be, note why and make it text. True when it was."""
    try:
        key = loader.construct_object(node, deep=True)
        hash(key)  # a key must be one (`!!binary` is bytes, a date is hashable: all scalars are)
        return True
    except yaml.YAMLError as e:
        message = getattr(e, "problem", None) or str(e)
    except TypeError as e:  # pragma: no cover - no safe scalar is unhashable
        message = str(e)
    found.append(Unreadable(field, node, message))
    node.tag = _STR_TAG
    return False


def within(outer: str | None, inner: str) -> bool:
    """Whether field `inner` is `outer` or a part of it (`steps[0]` holds `steps[0].agent`)."""
    return outer is not None and (inner == outer or inner.startswith((outer + ".", outer + "[")))


class _CapturingYAML(YAMLHandler):
    """python-frontmatter's YAML handler, keeping what it parsed.

    `frontmatter.loads` drops frontmatter that is not a mapping without a word; keeping the
    raw value lets us report it. `rewrite` is the lenient pass. One instance per read.
    `unfit` holds what could not be taken (`unreadable`)."""

    def __init__(self, rewrite: typing.Callable[[str], str] | None = None):
        self.rewrite = rewrite
        self.raw: Any = None
        self.fm = ""
        self.unfit: list[Unreadable] = []

    def load(self, fm: str, **kwargs: object) -> Any:
        if self.rewrite is not None:
            fm = self.rewrite(fm)
        self.fm = fm
        loader = StrictLoader(fm)
        try:
            node = loader.get_single_node()
            self.unfit = unreadable(loader, node)
            self.raw = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
        # python-frontmatter passes a mapping on as keyword arguments, which a key that is
        # not text (`5: x`) breaks: the caller reads `raw` (and reports such keys) instead.
        return {}


# A `key: value` line (optionally a `- key: value` list item) whose value is a plain scalar.
_KEY_VALUE = re.compile(
    r"^(?P<lead>[ \t]*(?:-[ \t]+)?)(?P<key>[A-Za-z0-9_][^:#]*?|\"[^\"]*\"|'[^']*'):[ \t]+(?P<value>\S.*?)[ \t]*$"
)

_NOT_PLAIN = tuple("\"'[{|>&*!%@`")

_BLOCK_SCALAR = re.compile(r"^[|>][-+0-9]*$")


def _quote_colon_values(fm: str) -> tuple[str, list[tuple[int, str]]]:
    """Quote plain values that contain `: ` (or end with `:`), which YAML reads as a nested
    mapping and refuses (`description: Use when: the user asks`).

    Returns the new text (the same number of lines) and the (line index, key) of each value
    quoted. Lines inside block scalars (`key: |`) are left alone."""
    out: list[str] = []
    quoted: list[tuple[int, str]] = []
    block_indent: int | None = None  # indent of the key that opened a block scalar
    for i, line in enumerate(fm.split("\n")):
        indent = len(line) - len(line.lstrip(" \t"))
        if block_indent is not None:
            if not line.strip() or indent > block_indent:
                out.append(line)
                continue
            block_indent = None
        m = _KEY_VALUE.match(line)
        if not m:
            out.append(line)
            continue
        value = m.group("value")
        if _BLOCK_SCALAR.match(value.split(" #")[0].strip()):
            block_indent = indent
            out.append(line)
            continue
        if value.startswith(_NOT_PLAIN) or value.startswith("#"):
            out.append(line)
            continue
        # In a plain scalar, " #" starts a comment: keep the comment outside the quotes.
        comment = ""
        if " #" in value:
            value, rest = value.split(" #", 1)
            value, comment = value.rstrip(), " #" + rest
        if ": " not in value and not value.endswith(":"):
            out.append(line)
            continue
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'{m.group("lead")}{m.group("key")}: "{escaped}"{comment}')
        quoted.append((i, m.group("key").strip("\"'")))
    return "\n".join(out), quoted


def read_text(path: Path, rel: str) -> str:
    """A file's text as UTF-8; `WorkspaceInvalid` naming the file when it is not."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WorkspaceInvalid(f"cannot read {rel}", [Problem(file=rel, message=f"cannot read: {e.strerror or e}")]) from None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise WorkspaceInvalid(
            f"{rel} is not UTF-8 text",
            [Problem(file=rel, line=line, message=f"not UTF-8 text (byte {e.start})")],
        ) from None


def yaml_error_at(e: yaml.YAMLError, text: str) -> tuple[int | None, str]:
    """Where (0-based line of `text`, when known) and what a YAML error says, in one line.
    A character YAML does not take (a control character) is a ReaderError with a position."""
    if isinstance(e, yaml.reader.ReaderError):
        return text[: e.position].count("\n"), f"unacceptable character #x{e.character:04x}: {e.reason}"
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return (mark.line if mark is not None else None), getattr(e, "problem", None) or str(e)


def _yaml_problem(e: yaml.YAMLError, rel: str, first_line: int, fm: str = "") -> Problem:
    """A YAML error as a Problem; `first_line` is the file line of the text's line 0."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    at, what = yaml_error_at(e, fm)
    line = first_line + at if at is not None else None
    context = getattr(e, "context", None)
    context_mark = getattr(e, "context_mark", None)
    if context and context_mark is not None and context_mark is not mark:
        context += f" started on line {first_line + context_mark.line}"
    if isinstance(e, UnfitValue):
        return Problem(file=rel, line=line, message=f"frontmatter: {what}")
    message = f"frontmatter does not parse: {what}" + (f" ({context})" if context else "")
    return Problem(file=rel, line=line, message=message)


class _Lines(typing.NamedTuple):
    keys: dict[str, int]  # top-level key -> its line; a list's items as `key[i]`
    text: dict[str, int]  # a block scalar (`key: |`) by field -> the line its text starts on
    bad_keys: list[Problem]  # keys that are not text (`5: x`, `~: x`); `file` left empty


def _key_lines(fm: str, first_line: int) -> _Lines:
    """Where things are in frontmatter that has parsed: the file line of each top-level key
    and list item, where each block scalar's text starts, and a problem for each key that
    is not text."""
    lines = _Lines({}, {}, [])
    try:
        node = yaml.compose(fm, Loader=StrictLoader)
    except yaml.YAMLError:  # pragma: no cover - the text has just parsed
        return lines
    if not isinstance(node, yaml.MappingNode):
        return lines
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        key = str(k.value)
        lines.keys[key] = first_line + k.start_mark.line
        if k.tag != "tag:yaml.org,2002:str":
            tag = k.tag.rsplit(":", 1)[-1]
            what = {"int": "a number", "float": "a number", "bool": "true/false", "null": "null"}.get(tag, tag)
            lines.bad_keys.append(
                Problem(
                    file="",
                    line=lines.keys[key],
                    field=key[:40],
                    message=f"a setting's name must be text, not {what} ({key[:40]}); quote it or remove it",
                )
            )
        fields = [(key, v)] + (
            [(f"{key}[{i}]", item) for i, item in enumerate(v.value)] if isinstance(v, yaml.SequenceNode) else []
        )
        for field, value in fields:
            if field != key:
                lines.keys[field] = first_line + value.start_mark.line
                _inner_lines(lines.keys, field, value, first_line, depth=2)  # `apis[0].headers.X`
            if isinstance(value, yaml.ScalarNode) and value.style in ("|", ">"):
                lines.text[field] = first_line + value.start_mark.line + 1
    return lines


def _inner_lines(keys: dict[str, int], field: str, node: yaml.Node, first_line: int, *, depth: int) -> None:
    """The lines of a list item's own keys (`field.key`), `depth` levels down."""
    if depth <= 0 or not isinstance(node, yaml.MappingNode):
        return
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode):
            inner = f"{field}.{k.value}"
            keys.setdefault(inner, first_line + k.start_mark.line)
            _inner_lines(keys, inner, v, first_line, depth=depth - 1)


# What `read_front` parsed, by (rel, text): a file is read afresh every time, and only its
# parse is reused when its bytes are the very same (an edited file is a new key at once,
# whatever its mtime or path, also in a fresh copy of the workspace). Bounded; a file that
# does not parse is never kept (its error is raised afresh). Each caller gets its own copy.
PARSED_KEPT = 256

_parsed: OrderedDict[tuple[str, str], Front] = OrderedDict()

_parsed_lock = threading.Lock()


def _handed_out(front: Front) -> Front:
    """A copy of a kept parse that its caller may change without changing the kept one."""
    return Front(
        copy.deepcopy(front.data),
        front.body,
        [p.model_copy() for p in front.warnings],
        dict(front.lines),
        dict(front.text_lines),
        [p.model_copy() for p in front.errors],
    )


def read_front(path: Path, rel: str) -> Front:
    """A Markdown file's frontmatter (`Front`), read from disk now; see `read_frontmatter`."""
    text = read_text(path, rel)
    key = (rel, text)
    with _parsed_lock:
        kept = _parsed.get(key)
        if kept is not None:
            _parsed.move_to_end(key)
    if kept is None:
        kept = _parse_front(text, rel)
        with _parsed_lock:
            _parsed[key] = kept
            while len(_parsed) > PARSED_KEPT:
                _parsed.popitem(last=False)
    return _handed_out(kept)


def _parse_front(text: str, rel: str) -> Front:
    stripped = text.strip()  # as python-frontmatter does before splitting
    lead = text[: len(text) - len(text.lstrip())].count("\n")
    opening = YAMLHandler.FM_BOUNDARY.match(stripped)
    if not opening:
        return Front({}, stripped, [], {})
    # The file line of the frontmatter text's first line: the rest of the opening `---` line.
    first_line = lead + stripped.count("\n", 0, opening.end()) + 1
    if len(YAMLHandler.FM_BOUNDARY.split(stripped, 2)) < 3:
        raise WorkspaceInvalid(
            f"{rel} does not parse",
            [Problem(file=rel, line=lead + 1, message="frontmatter opened with '---' is never closed")],
        )

    handler = _CapturingYAML()
    warnings: list[Problem] = []
    try:
        post = frontmatter.loads(text, handler=handler)
    except yaml.YAMLError as strict_error:
        quoted: list[tuple[int, str]] = []

        def lenient(fm: str) -> str:
            new, found = _quote_colon_values(fm)
            quoted.extend(found)
            return new

        handler = _CapturingYAML(lenient)
        try:
            post = frontmatter.loads(text, handler=handler)
        except yaml.YAMLError as e:
            error = e if quoted else strict_error
            raise WorkspaceInvalid(f"{rel} does not parse", [_yaml_problem(error, rel, first_line, handler.fm)]) from None
        if not quoted:  # pragma: no cover - the lenient pass changed nothing, so it fails too
            problem = _yaml_problem(strict_error, rel, first_line, handler.fm)
            raise WorkspaceInvalid(f"{rel} does not parse", [problem]) from None
        warnings = [
            Problem(
                file=rel,
                line=first_line + i,
                field=key,
                severity="warning",
                message="value read leniently: it contains ': ', so it was read as one quoted "
                "string; quote it in the file to make that explicit",
            )
            for i, key in quoted
        ]

    raw = handler.raw
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise WorkspaceInvalid(
            f"{rel} does not parse",
            [
                Problem(
                    file=rel,
                    line=first_line,
                    message=f"frontmatter must be a mapping of settings (key: value), not {type_name(raw)}",
                )
            ],
        )
    unfit = [
        Problem(file=rel, line=first_line + u.node.start_mark.line, field=u.field or None, message=u.message)
        for u in handler.unfit
    ]
    lines = _key_lines(handler.fm, first_line)
    if lines.bad_keys:  # a key laneflow cannot name is read no further (a date that is no date is said once)
        said = {(p.line, p.field) for p in unfit}
        bad = [p.model_copy(update={"file": rel}) for p in lines.bad_keys if (p.line, p.field) not in said]
        raise WorkspaceInvalid(f"{rel} does not parse", sorted(unfit + bad, key=lambda p: p.line or 0))
    # A setting holding a value that could not be taken is left out, so it is not also
    # checked as the text it was turned into: its problem is said once, and the rest of the
    # file is checked as usual.
    data = {str(k): v for k, v in raw.items() if not any(within(str(k), u.field) for u in handler.unfit)}
    return Front(data, post.content, warnings, lines.keys, lines.text, unfit)


def read_frontmatter(path: Path, rel: str) -> tuple[dict[str, Any], str, list[Problem]]:
    """Read a Markdown file's YAML frontmatter and body.

    Strict first; YAML that fails because a plain value contains `: ` is read again with
    such values quoted, and each one comes back as a warning. `rel` is the path shown in
    problems (relative to the workspace).

    Returns (settings mapping, body, warnings). Raises `WorkspaceInvalid` naming the file
    and line when the file is not UTF-8, the frontmatter does not parse even leniently, or
    it is not a mapping, or holds a value that cannot be taken (`Front.errors`). A file
    without frontmatter is all body."""
    front = read_front(Path(path), rel)
    if front.errors:
        raise WorkspaceInvalid(f"{rel} does not parse", front.errors)
    return front.data, front.body, front.warnings


def type_name(value: Any) -> str:
    """A value's kind in words, as a problem names what it got."""
    if value is None:
        return "null"
    return {
        bool: "true/false",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)
