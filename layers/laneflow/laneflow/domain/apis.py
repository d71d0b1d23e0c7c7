"""API tools (agent.md `apis:`): each entry becomes the tool `api_<name>`, an HTTP client that
reaches only its base URL's scheme, host and port, under its base path.

An entry is `{name, base_url, openapi (optional), headers (optional)}`:
- `name`: letters, digits, `_` and `-` (at most 60), so `api_<name>` is a valid tool name;
- `base_url`: `http://` or `https://`, a host, an optional port and base path; no user or
  password (put credentials in a header), no query or fragment;
- `headers`: name -> value; a value may name a declared secret as `${NAME}` (it must be in the
  agent's `secrets:`, as a plain NAME, not `@NAME`); the value is filled in at call time and
  never recorded;
- `openapi`: a file relative to the agent's folder (JSON or YAML) whose operations (method,
  path, summary) are listed in the `apis` prompt layer.

This module is pure: parsing and checking the entries (what `laneflow check` reports, with
file, line and field), reading an OpenAPI file's operations, parsing one call's input
(`parse_call`) and resolving the URL it may reach (`target_url`). The HTTP call itself is
`adapters/executors/api_tools.py`.
"""

from __future__ import annotations

import difflib
import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

import yaml
from pydantic import BaseModel, Field

from laneflow.domain import jsonsafe
from laneflow.domain.entries import SECRET_REF, EntryProblems, fill_secrets
from laneflow.domain.errors import Problem
from laneflow.domain.frontmatter import StrictLoader, UnfitValue, unreadable

API_PREFIX = "api_"

ENTRY_KEYS = ("name", "base_url", "openapi", "headers")

CALL_KEYS = ("method", "path", "query", "body")

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

MAX_OPERATIONS = 200  # listed in the prompt layer; past that the layer says how many more

MAX_OPENAPI_BYTES = 2_000_000

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,60}$")

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")

_PATH_SAFE = "/:@!$&'()*+,;=-._~"


class ApiOperation(BaseModel):
    """One operation of an OpenAPI file: what the prompt layer lists."""

    method: str
    path: str
    summary: str = ""


class ApiSpec(BaseModel):
    """One `apis:` entry, checked."""

    name: str
    base_url: str
    headers: dict[str, str] = Field(default_factory=dict)  # values as written (`${NAME}` unfilled)
    openapi: str | None = None  # as written, relative to the agent's folder
    operations: list[ApiOperation] = Field(default_factory=list)

    @property
    def tool_name(self) -> str:
        return API_PREFIX + self.name

    @property
    def secret_names(self) -> list[str]:
        """The declared secrets its headers name, in order, each once."""
        found = [m.group(1) for value in self.headers.values() for m in SECRET_REF.finditer(value)]
        return list(dict.fromkeys(found))


# --------------------------------------------------------------------------- checking entries


@dataclass
class _Checker(EntryProblems):
    agent_dir: Path
    secrets: list[str]  # the agent's `secrets:` as written

    def entry(self, index: int, raw: Any, seen: set[str]) -> ApiSpec | None:
        if not isinstance(raw, dict):
            self.error(index, "", "an API is a mapping: {name, base_url, headers, openapi}")
            return None
        before = len(self.problems)
        self.unknown_keys(index, raw, ENTRY_KEYS, "an API")
        name = self.name(index, raw.get("name"), seen)
        base = self.base_url(index, raw.get("base_url"))
        headers = self.headers(index, raw.get("headers"))
        openapi, operations = self.openapi(index, raw.get("openapi"))
        if len(self.problems) != before or name is None or base is None or headers is None:
            return None
        return ApiSpec(name=name, base_url=base, headers=headers, openapi=openapi, operations=operations)

    def name(self, index: int, name: Any, seen: set[str]) -> str | None:
        if name is None:
            self.error(index, "name", "an API needs 'name:' (its tool is api_<name>)")
            return None
        if not isinstance(name, str) or not _NAME.match(name):
            self.error(index, "name", f"name is letters, digits, _ and - (at most 60), got {name!r}")
            return None
        if name in seen:
            self.error(index, "name", f"API {name!r} is listed twice")
            return None
        seen.add(name)
        return name

    def base_url(self, index: int, url: Any) -> str | None:
        if url is None:
            self.error(index, "base_url", "an API needs 'base_url:' (such as https://api.example.com/v1)")
            return None
        problem = base_url_problem(url)
        if problem:
            self.error(index, "base_url", problem)
            return None
        return str(url)

    def headers(self, index: int, headers: Any) -> dict[str, str] | None:
        if headers is None:
            return {}
        if not isinstance(headers, dict):
            self.error(index, "headers", "headers is a mapping of header name to value")
            return None
        plain = {s for s in self.secrets if isinstance(s, str) and not s.startswith("@")}
        files = {s[1:] for s in self.secrets if isinstance(s, str) and s.startswith("@")}
        good: dict[str, str] = {}
        for key, value in headers.items():
            field = f"headers.{key}"
            if not isinstance(key, str) or not _HEADER_NAME.match(key):
                self.error(index, field, f"{key!r} is not a header name")
                continue
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                self.error(index, field, "a header's value is text (it may name a secret as ${NAME})")
                continue
            text = str(value)
            if any(c in text for c in "\r\n\x00"):
                self.error(index, field, "a header's value cannot hold a line break or NUL")
                continue
            for ref in SECRET_REF.findall(text):
                if ref in files:
                    self.error(
                        index,
                        field,
                        f"header {key} names secret {ref}, which is declared as a file (@{ref}); declare it as {ref} to use it in a header",
                    )
                elif ref not in plain:
                    close = difflib.get_close_matches(ref, sorted(plain), n=1, cutoff=0.6)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    self.error(index, field, f"header {key} names secret {ref}, which is not in this agent's secrets:{hint}")
            good[key] = text
        return good

    def openapi(self, index: int, ref: Any) -> tuple[str | None, list[ApiOperation]]:
        if ref is None:
            return None, []
        if not isinstance(ref, str) or not ref.strip():
            self.error(index, "openapi", "openapi is a file relative to the agent's folder (such as api/openapi.json)")
            return None, []
        posix = PurePosixPath(ref.replace("\\", "/"))
        if posix.is_absolute() or ".." in posix.parts:
            self.error(index, "openapi", f"openapi file {ref!r} must be a path inside the agent's folder")
            return None, []
        path = self.agent_dir / posix
        shown = f"{Path(self.rel).parent.as_posix()}/{posix.as_posix()}"
        try:
            inside = path.resolve().is_relative_to(self.agent_dir.resolve())
        except (OSError, RuntimeError):
            inside = False
        if not inside:
            self.error(index, "openapi", f"openapi file {shown} leads outside the agent's folder (a symlink); it is not read")
            return None, []
        if not path.is_file():
            self.error(index, "openapi", f"openapi file {shown} not found")
            return None, []
        operations, problem = read_operations(path)
        if problem:
            self.error(index, "openapi", f"openapi file {shown} {problem}")
            return None, []
        return ref, operations


def base_url_problem(url: Any) -> str:
    """Why `url` cannot be an API's base URL ("" when it can)."""
    if not isinstance(url, str) or not url.strip():
        return "base_url is a URL such as https://api.example.com/v1"
    if any(c in url for c in " \r\n\t\x00\\"):
        return "base_url cannot hold spaces, line breaks or backslashes"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as e:
        return f"base_url is not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return f"base_url must start with http:// or https://, got {parts.scheme or 'no scheme'}"
    if not parts.hostname:
        return "base_url has no host"
    if parts.username is not None or parts.password is not None:
        return "base_url cannot carry a user or password; put credentials in a header naming a secret (${NAME})"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return "base_url cannot carry a query or fragment; pass query parameters in each call's query"
    return ""


def check_apis(
    raw: Any, *, rel: str, agent_dir: Path, lines: dict[str, int], secrets: Any
) -> tuple[list[ApiSpec], list[Problem]]:
    """An agent's `apis:` as written: (the checked entries, the problems, each naming the
    agent.md, the entry's line and its field)."""
    if raw is None:
        return [], []
    problems: list[Problem] = []
    if not isinstance(raw, list):
        problems.append(
            Problem(
                file=rel, line=lines.get("apis"), field="apis", message="apis is a list of {name, base_url, headers, openapi}"
            )
        )
        return [], problems
    declared = list(secrets) if isinstance(secrets, list) else []
    checker = _Checker(setting="apis", rel=rel, lines=lines, problems=problems, agent_dir=agent_dir, secrets=declared)
    seen: set[str] = set()
    specs = [spec for index, entry in enumerate(raw) if (spec := checker.entry(index, entry, seen)) is not None]
    return specs, problems


# --------------------------------------------------------------------------- OpenAPI


def read_operations(path: Path) -> tuple[list[ApiOperation], str]:
    """An OpenAPI (or Swagger) file's operations, in file order: ([...], "") or ([], why not)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        return [], f"cannot be read ({type(e).__name__})"
    if len(data) > MAX_OPENAPI_BYTES:
        return [], f"is larger than {MAX_OPENAPI_BYTES:,} bytes"
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return [], "is not UTF-8 text"
    doc, problem = _document(text, json_text=path.suffix.lower() == ".json")
    if problem:
        return [], problem
    paths = doc.get("paths") if isinstance(doc, dict) else None
    if not isinstance(paths, dict):
        return [], "is not an OpenAPI document (no 'paths:' mapping)"
    operations = []
    for route, item in paths.items():
        if not isinstance(item, dict):
            continue
        for method, op in item.items():
            if not isinstance(method, str) or method.upper() not in METHODS:
                continue
            summary = ""
            if isinstance(op, dict):
                raw = op.get("summary") or op.get("operationId") or op.get("description") or ""
                summary = str(raw).strip().splitlines()[0][:200] if str(raw).strip() else ""
            operations.append(ApiOperation(method=method.upper(), path=str(route), summary=summary))
    return operations, ""


def _document(text: str, *, json_text: bool) -> tuple[Any, str]:
    """An OpenAPI file's document, read strictly (a repeated key is refused in JSON and in
    YAML): (document, "") or (None, why not)."""
    try:
        return (jsonsafe.parse(text) if json_text else _yaml(text)), ""
    except json.JSONDecodeError as e:
        return None, f"is not valid JSON (line {e.lineno}: {e.msg})"
    except jsonsafe.Refusal as e:
        return None, f"is not JSON laneflow takes ({e})"
    except UnfitValue as e:  # it parses, but holds what cannot be taken
        mark = e.problem_mark
        return None, f"is not YAML laneflow takes ({f'line {mark.line + 1}: ' if mark else ''}{e.problem})"
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        return None, f"is not valid YAML{f' (line {mark.line + 1})' if mark else ''}"


def _yaml(text: str) -> Any:
    """A YAML document, strictly: a value that cannot be constructed, or a key given twice,
    is an `UnfitValue` naming its field (the first one; the file is refused either way)."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        unfit = unreadable(loader, node)
        if unfit:
            first = unfit[0]
            raise UnfitValue(None, None, f"{first.field or 'the document'}: {first.message}", first.node.start_mark)
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def layer_text(apis: list[ApiSpec]) -> str:
    """The `apis` prompt layer: each API tool, where it reaches, which headers it sends (names
    only), and its OpenAPI operations. Stable: it changes only when agent.md or the file does."""
    if not apis:
        return ""
    parts = [
        "# HTTP APIs you can call",
        'Call a tool api_<name> with {"method": "GET", "path": "/...", "query": {...}, "body": ...}; '
        "the path is relative to the API's base URL, and only that host can be reached. "
        "Credentials are added for you: never put them in a call.",
    ]
    for spec in apis:
        line = f"## {spec.tool_name}: {spec.base_url}"
        if spec.headers:
            line += f" (sends the headers {', '.join(sorted(spec.headers))})"
        parts.append(line)
        shown = spec.operations[:MAX_OPERATIONS]
        parts.extend(f"- {op.method} {op.path}" + (f": {op.summary}" if op.summary else "") for op in shown)
        if len(spec.operations) > len(shown):
            parts.append(f"- ... and {len(spec.operations) - len(shown)} more operations (see {spec.openapi})")
    return "\n".join(parts)


# --------------------------------------------------------------------------- one call


class CallInvalid(ValueError):
    """A call's input is not what an API tool takes (the model is told why)."""


@dataclass(frozen=True)
class ApiCall:
    method: str
    path: str  # as given
    query: list[tuple[str, str]]
    body: bytes | None
    content_type: str | None


def _query(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise CallInvalid("query is a mapping of parameter name to value")
    pairs: list[tuple[str, str]] = []
    for key, item in value.items():
        if not isinstance(key, str):
            raise CallInvalid("query parameter names are text")
        for one in item if isinstance(item, list) else [item]:
            if isinstance(one, bool):
                pairs.append((key, "true" if one else "false"))
            elif isinstance(one, (str, int, float)):
                pairs.append((key, str(one)))
            elif one is None:
                pairs.append((key, ""))
            else:
                raise CallInvalid(f"query parameter {key!r} is text, a number, true/false or a list of them")
    return pairs


def parse_call(args: Any) -> ApiCall:
    """One API tool call's input: `{method (GET default), path, query, body}`. A text body is
    sent as text, any other JSON value as JSON. Raises `CallInvalid` saying what is wrong."""
    if not isinstance(args, dict):
        raise CallInvalid(f'an API tool takes {{"method", "path", "query", "body"}}, not {type(args).__name__}')
    unknown = [str(k) for k in args if k not in CALL_KEYS]
    if unknown:
        raise CallInvalid(f"unknown key {unknown[0]!r}; an API call takes {', '.join(CALL_KEYS)}")
    method = args.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise CallInvalid(f"method is one of {', '.join(METHODS)}, got {method!r}")
    path = args.get("path", "/")
    if not isinstance(path, str):
        raise CallInvalid("path is text, such as /items/42")
    if any(c in path for c in "\r\n\x00"):
        raise CallInvalid("path cannot hold a line break or NUL")
    query = _query(args.get("query"))
    body, content_type = None, None
    if "body" in args and args["body"] is not None:
        raw = args["body"]
        if isinstance(raw, str):
            body, content_type = raw.encode("utf-8", "surrogatepass"), "text/plain; charset=utf-8"
        else:
            try:
                body, content_type = json.dumps(raw, ensure_ascii=False).encode("utf-8", "surrogatepass"), "application/json"
            except (TypeError, ValueError) as e:
                raise CallInvalid(f"body is not JSON ({e})") from None
        if method.upper() in ("GET", "HEAD"):
            raise CallInvalid(f"a {method.upper()} call has no body")
    return ApiCall(method=method.upper(), path=path, query=query, body=body, content_type=content_type)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL, the port filled in from the scheme."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def _base_path(base_url: str) -> str:
    """The base URL's path, ending in `/`: every call's path must stay under it."""
    path = urlsplit(base_url).path or "/"
    return path if path.endswith("/") else path + "/"


def _normalized(path: str) -> str:
    """A URL path decoded, its dot segments resolved (also percent-encoded ones)."""
    segments = [unquote(s) for s in path.split("/")]
    if any("/" in s or "\\" in s for s in segments):  # %2f or a backslash hides a segment break
        raise CallInvalid("refused: a path cannot hold an encoded / or a backslash")
    joined = posixpath.normpath("/" + "/".join(segments))
    if path.endswith("/") and not joined.endswith("/"):
        joined += "/"
    return "/" + joined.lstrip("/")


def within(base_url: str, url: str) -> str:
    """Why `url` is outside what `base_url` may reach ("" when it is inside): another scheme,
    host or port, or a path outside the base path."""
    try:
        same = origin(url) == origin(base_url)
        path = _normalized(urlsplit(url).path or "/")
    except CallInvalid as e:
        return str(e).removeprefix("refused: ")
    except ValueError:
        return "it is not a URL"
    if not same:
        scheme, host, port = origin(url)
        return f"{scheme}://{host}:{port} is not this API's host ({urlsplit(base_url).netloc})"
    base = _base_path(base_url)
    if not (path + "/").startswith(base):
        return f"the path {path} is outside the API's base path {base}"
    return ""


def _absolute(path: str) -> bool:
    return path.startswith("//") or urlsplit(path).scheme.lower() in ("http", "https")


def target_url(base_url: str, call: ApiCall) -> str:
    """The URL a call reaches: its path under the base URL's path (an absolute URL only when
    it is this API's own), dot segments resolved. Raises `CallInvalid` ("refused: ...") for a
    path that leaves the base URL: another host, scheme or port, or `..` past the base path."""
    given = call.path
    try:
        if _absolute(given):
            parts = urlsplit(given)
            why = within(base_url, given) if parts.scheme else f"{given!r} names another host"
            if why:
                raise CallInvalid(f"refused: {why}; give a path such as /items")
            path, query = parts.path or "/", parts.query
        else:
            relative, _, query = given.partition("?")
            relative = relative.partition("#")[0]
            path = _base_path(base_url) + relative.lstrip("/")
            if not relative.strip("/"):  # the base URL itself, as written
                path = urlsplit(base_url).path or "/"
    except CallInvalid:
        raise
    except ValueError as e:  # urlsplit: a malformed host or port
        raise CallInvalid(f"path is not a URL path ({e})") from None
    clean = _normalized(path)
    base = urlsplit(base_url)
    url = f"{base.scheme}://{base.netloc}{quote(clean, safe=_PATH_SAFE)}"
    why = within(base_url, url)
    if why:
        raise CallInvalid(f"refused: {why}")
    query = "&".join(q for q in (quote(query, safe="=&+%/:@!$'()*,;?-._~"), urlencode(call.query)) if q)
    return url + (f"?{query}" if query else "")


def fill_headers(spec: ApiSpec, values: dict[str, str]) -> dict[str, str]:
    """The headers with each `${NAME}` filled from `values` (NAME -> value). Raises `KeyError`
    naming a secret that is not loaded."""

    return fill_secrets(spec.headers, values)
