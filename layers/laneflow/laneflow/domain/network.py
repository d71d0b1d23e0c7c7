"""The network a sandboxed agent's programs may reach (agent.md `network:`): `none` (the
default) or a list of destinations, each `host` or `host:port`.

- `host` is a name (`pypi.org`), an IPv4 address (`127.0.0.1`) or an IPv6 one in brackets
  (`[::1]:8080`); a leading `*.` matches the subdomains of what follows (`*.github.com` is
  `api.github.com`, never `github.com` itself: list both for both);
- without a port, an entry allows ports 80 and 443 (plain HTTP and TLS), with one, that port
  alone;
- hosts compare case-insensitively, a trailing dot (`example.com.`) ignored.

This module is pure: parsing an entry (`parse_entry`), the problems `laneflow check` reports
for an agent's list (`network_problems`, naming file, line and field) and matching a
destination against the list (`Allowlist.allows`). The proxy that enforces it is
`adapters/executors/egress_proxy.py`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from laneflow.domain.errors import Problem
from laneflow.domain.frontmatter import type_name

NONE = "none"

DEFAULT_PORTS = (80, 443)  # a host without a port: plain HTTP and TLS

MAX_ENTRIES = 200

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")


class BadEntry(ValueError):
    """One `network:` entry that is not a destination (the message says why)."""


@dataclass(frozen=True)
class Destination:
    """One checked entry: its host (lower case, no trailing dot; for `*.x`, `x`), its port
    (None: 80 and 443) and whether it matches the host's subdomains instead of the host."""

    host: str
    port: int | None = None
    wildcard: bool = False

    def text(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        host = f"*.{host}" if self.wildcard else host
        return host if self.port is None else f"{host}:{self.port}"

    def allows(self, host: str, port: int) -> bool:
        if port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        name = normal_host(host)
        if self.wildcard:
            return name.endswith("." + self.host)  # a subdomain: never the bare domain itself
        return name == self.host


def normal_host(host: str) -> str:
    """A host as compared: lower case, without a trailing dot or an IPv6 address's brackets,
    an IP address in its canonical form."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    name = name[:-1] if name.endswith(".") else name
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def _split_port(text: str) -> tuple[str, str | None]:
    """(host, port as written or None), for `host`, `host:port`, `[v6]` and `[v6]:port`."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise BadEntry("an IPv6 address opens [ but never closes it")
        rest = text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise BadEntry("after an IPv6 address's ] comes :port or nothing")
        return text[1:end], (rest[1:] if rest else None)
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, port
    if ":" in text:
        raise BadEntry("an IPv6 address is written in brackets, as [::1] or [::1]:8080")
    return text, None


def _port(written: str | None) -> int | None:
    if written is None:
        return None
    if not written.isascii() or not written.isdigit():
        raise BadEntry(f"the port {written!r} is not a number")
    port = int(written)
    if not 1 <= port <= 65535:
        raise BadEntry(f"the port {port} is out of range (1 to 65535)")
    return port


def _host(written: str, bracketed: bool) -> tuple[str, bool]:
    """(the host as compared, whether it is a `*.` wildcard)."""
    wildcard = written.startswith("*.")
    name = written[2:] if wildcard else written
    if "*" in name or (written.startswith("*") and not wildcard):
        raise BadEntry("a wildcard goes only at the start, as *.example.com")
    if not name:
        raise BadEntry("no host")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if bracketed and not isinstance(address, ipaddress.IPv6Address):
        raise BadEntry(f"{name!r} in brackets is not an IPv6 address")
    if address is not None:
        if wildcard:
            raise BadEntry("a wildcard matches a name's subdomains, not an address's")
        return str(address), False
    name = name.lower()
    name = name[:-1] if name.endswith(".") else name
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise BadEntry(f"{written!r} is not a host name (letters, digits, - and _, in dot-separated labels)")
    return name, wildcard


def parse_entry(entry: Any) -> Destination:
    """One entry as written: its `Destination`, else `BadEntry` saying why."""
    if not isinstance(entry, str):
        raise BadEntry(f"expected a host or host:port, got {type_name(entry)}")
    text = entry.strip()
    if not text:
        raise BadEntry("an empty entry")
    if "://" in text:
        raise BadEntry("a destination has no scheme: write the host alone (example.com) or host:port")
    if "/" in text:
        raise BadEntry("a destination has no path: write the host alone (example.com) or host:port")
    if any(c.isspace() or c in "@?#\\" for c in text):
        raise BadEntry("a destination is a host or host:port, with no spaces, user, query or fragment")
    host, port = _split_port(text)
    name, wildcard = _host(host, text.startswith("["))
    return Destination(name, _port(port), wildcard)


def parse_network(value: Any) -> tuple[tuple[Destination, ...], list[tuple[int | None, str]]]:
    """`network:` as written: (its destinations, its problems as (entry index or None, why)).
    None and `none` are no network."""
    if value is None or (isinstance(value, str) and value.strip().lower() == NONE):
        return (), []
    if not isinstance(value, list):
        return (), [(None, f"expected none or a list of host / host:port entries, got {type_name(value)}")]
    if len(value) > MAX_ENTRIES:
        return (), [(None, f"at most {MAX_ENTRIES} entries (this list has {len(value)})")]
    found: list[Destination] = []
    problems: list[tuple[int | None, str]] = []
    for index, entry in enumerate(value):
        try:
            destination = parse_entry(entry)
        except BadEntry as bad:
            problems.append((index, str(bad)))
            continue
        if destination not in found:
            found.append(destination)
    return tuple(found), problems


def network_problems(value: Any, *, sandboxed: bool, rel: str, lines: dict[str, int]) -> list[Problem]:
    """`laneflow check`'s problems of an agent's `network:` (file, line and field): each entry
    that is not a destination, and a list on an agent whose steps run no program and are
    not sandboxed (nothing would use it)."""
    destinations, bad = parse_network(value)
    problems = [
        Problem(
            file=rel,
            line=lines.get(f"network[{index}]", lines.get("network")) if index is not None else lines.get("network"),
            field=f"network[{index}]" if index is not None else "network",
            message=why,
        )
        for index, why in bad
    ]
    if destinations and not sandboxed:
        problems.append(
            Problem(
                file=rel,
                line=lines.get("network"),
                field="network",
                message="network lets the programs an agent runs (bash, script tools) reach the listed hosts; "
                "this agent runs none and is not sandboxed, so it would be ignored",
            )
        )
    return problems


@dataclass(frozen=True)
class Allowlist:
    """The destinations a step's programs may reach: exactly those, nothing else."""

    entries: tuple[Destination, ...] = ()

    @classmethod
    def parse(cls, written: Iterable[str]) -> Allowlist:
        """From entries already checked (`network_problems`); a bad one raises `BadEntry`."""
        destinations: list[Destination] = []
        for entry in written:
            destination = parse_entry(entry)
            if destination not in destinations:
                destinations.append(destination)
        return cls(tuple(destinations))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def allows(self, host: str, port: int) -> bool:
        return any(entry.allows(host, port) for entry in self.entries)

    def texts(self) -> list[str]:
        return [entry.text() for entry in self.entries]

    def describe(self) -> str:
        return ", ".join(self.texts()) if self.entries else NONE
