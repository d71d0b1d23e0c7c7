"""EventBridge Scheduler's schedule expressions, read and checked, and when each fires.

Three kinds, as EventBridge Scheduler takes them:
- `rate(N unit)`: every N minutes, hours or days (`1 minute`, `5 minutes`: singular for 1,
  plural above), counted from an anchor (the schedule's creation, to the minute): the first
  firing is one period after it. A day is 24 hours, whatever the zone's clocks do.
- `cron(minutes hours day-of-month month day-of-week year)`: six fields, exactly one of
  day-of-month and day-of-week `?`; day-of-week 1-7 is SUN-SAT (or the names); `L` (the
  last day of the month; in day-of-week the last such weekday of the month, `6L`, or alone
  Saturday), `W` (the weekday nearest a day of the month, `15W`) and `#` (the nth weekday
  of the month, `2#1`) as EventBridge has them. It is evaluated on the zone's wall clock: a
  time the clocks skip (spring forward) does not fire, and a time they repeat (fall back)
  fires once, at its first occurrence.
- `at(yyyy-mm-ddThh:mm:ss)`: once, at that wall-clock time in the zone.

The calendar arithmetic is croniter's, run on naive wall-clock times (so no DST rule of
its own plays in), and the zones are zoneinfo's (with the `tzdata` package where the system
has no zone database). This module only checks each field's characters and translates
EventBridge's fields into croniter's seven-field form (`minute hour dom month dow second
year`: croniter's six-field form would take the year for seconds), day-of-week numbering
included (EventBridge's 1-7 from Sunday, croniter's 0-6).

Every check raises `ExpressionInvalid` (an `InvalidInput`) naming the field: `expression`
or `timezone`.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from laneflow.domain.errors import InvalidInput, Problem

if TYPE_CHECKING:
    from croniter import croniter as Croniter


def _croniter(expression: str, start: dt.datetime) -> Croniter[dt.datetime]:
    """croniter over naive wall-clock times (imported when first needed: it takes ~25 ms,
    which a command that never reads a schedule should not pay)."""
    from croniter import croniter

    return croniter(expression, start, max_years_between_matches=SEARCH_YEARS, ret_type=dt.datetime)


UTC = dt.UTC

# croniter's year field stops at 2099 (EventBridge's at 2199): a later year is refused here
# rather than never firing.
YEARS = (1970, 2099)

# How far ahead a cron expression is searched for its next firing (croniter's own bound is
# 50 years between matches): `cron(0 0 29 2 ? 2096)` still finds its day.
SEARCH_YEARS = 80

# The most a zone's clocks jump at once (DST is an hour; some zones' changes were two).
_SHIFT = dt.timedelta(hours=2)

_UNITS = {"minute": 60, "hour": 3600, "day": 86_400}

_RATE = re.compile(r"rate\(\s*([0-9]+)\s+([a-z]+)\s*\)")
_CRON = re.compile(r"cron\(([^()]*)\)")
_AT = re.compile(r"at\((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\)")

_FIELDS = ("minutes", "hours", "day-of-month", "month", "day-of-week", "year")

# What each field may hold, character by character (EventBridge's table of wildcards); what
# the characters make is croniter's to judge.
_MONTHS = "JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC"
_DAYS = "SUN|MON|TUE|WED|THU|FRI|SAT"
_CHARSETS = {
    "minutes": re.compile(r"[0-9,*/-]+"),
    "hours": re.compile(r"[0-9,*/-]+"),
    "day-of-month": re.compile(r"\?|([0-9,*/-]|L|W)+"),
    "month": re.compile(rf"([0-9,*/-]|{_MONTHS})+"),
    "day-of-week": re.compile(rf"\?|([0-9,*#-]|L|{_DAYS})+"),
    "year": re.compile(r"[0-9,*/-]+"),
}

_NUMBER = re.compile(r"\d+")

_MONTH_NAME = re.compile(_MONTHS)

_DAY_NAME = re.compile(_DAYS)

Kind = Literal["rate", "cron", "at"]


class ExpressionInvalid(InvalidInput):
    """A schedule expression or time zone that cannot be used: the problem names the field."""

    def __str__(self) -> str:
        return str(self.args[0])  # the one problem is the message: said once


def invalid(field: str, message: str) -> ExpressionInvalid:
    return ExpressionInvalid(f"{field}: {message}", [Problem(file="schedule", field=field, message=message)])


@dataclass(frozen=True)
class Expression:
    """A checked schedule expression: its kind, and what its firings are computed from
    (`every_s` for a rate, croniter's expression for a cron, the wall-clock time for an at)."""

    text: str
    kind: Kind
    every_s: int = 0
    cron: str = ""
    at: dt.datetime | None = None  # naive: the zone's wall clock

    def __str__(self) -> str:
        return self.text


def zone(name: str) -> ZoneInfo:
    """The time zone an IANA name names (`Europe/Berlin`, `UTC`), or `ExpressionInvalid`
    naming `timezone`."""
    if not isinstance(name, str) or not name or len(name) > 64 or name.startswith("/") or ".." in name:
        raise invalid("timezone", f"{str(name)[:64]!r} is not a time zone name (e.g. UTC, Europe/Berlin)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise invalid("timezone", f"no time zone {name!r} (e.g. UTC, Europe/Berlin, America/New_York)") from None


def zone_names() -> frozenset[str]:
    """Every zone name this machine knows (the tzdata package's, at least)."""
    return frozenset(available_timezones())


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> Expression:
    """Read and check an EventBridge Scheduler expression; `ExpressionInvalid` naming
    `expression` (and the cron field) when it cannot be used. (Kept per text: each look at a
    schedule reads its expression again, and checking one asks croniter seven times.)"""
    if not isinstance(text, str) or len(text) > 256:
        raise invalid("expression", "give rate(...), cron(...) or at(...), at most 256 characters")
    given = text.strip()
    if rate := _RATE.fullmatch(given):
        return _rate(given, int(rate.group(1)), rate.group(2))
    if cron := _CRON.fullmatch(given):
        return _cron(given, cron.group(1))
    if at := _AT.fullmatch(given):
        try:
            when = dt.datetime.fromisoformat(at.group(1))
        except ValueError:
            raise invalid("expression", f"{given}: not a date and time") from None
        return Expression(given, "at", at=when)
    raise invalid(
        "expression",
        f"{given[:80]!r} is not an EventBridge schedule expression: rate(15 minutes), cron(0 7 * * ? *) or"
        " at(2026-12-24T06:00:00)",
    )


def _rate(text: str, value: int, unit: str) -> Expression:
    singular = unit.removesuffix("s")
    if singular not in _UNITS:
        raise invalid("expression", f"{text}: the unit is minute(s), hour(s) or day(s), not {unit!r}")
    if value < 1 or value > 1_000_000:
        raise invalid("expression", f"{text}: the value is a whole number from 1")
    if (value == 1) != (unit == singular):
        raise invalid("expression", f"{text}: say rate(1 {singular}) for one, rate({max(value, 2)} {singular}s) for more")
    return Expression(text, "rate", every_s=value * _UNITS[singular])


def _cron(text: str, body: str) -> Expression:
    fields = body.split()
    if len(fields) != 6:
        raise invalid(
            "expression",
            f"{text}: a cron expression has six fields (minutes hours day-of-month month day-of-week year), not {len(fields)}",
        )
    named = dict(zip(_FIELDS, (f.upper() for f in fields), strict=True))
    for field, value in named.items():
        if not _CHARSETS[field].fullmatch(value):
            raise invalid("expression", f"{text}: {field} {value!r} holds what EventBridge does not take there")
    dom, dow = named["day-of-month"], named["day-of-week"]
    if (dom == "?") == (dow == "?"):
        raise invalid("expression", f"{text}: exactly one of day-of-month and day-of-week is '?'")
    if "LW" in dom:
        raise invalid("expression", f"{text}: day-of-month 'LW' is not supported; use 'L' or a day with W (15W)")
    translated = [
        named["minutes"],
        named["hours"],
        "*" if dom == "?" else dom.lower(),
        _MONTH_NAME.sub(lambda m: str(_MONTHS.split("|").index(m.group(0)) + 1), named["month"]),
        "*" if dow == "?" else _weekdays(text, dow),
        "0",
        named["year"],
    ]
    # croniter reads a range of one value (`2-2`, `12/1` in months, `5-5/2`) as every value:
    # each such term is written as that value.
    translated = [_single_values(part, *_CRONITER_RANGES[at]) for at, part in enumerate(translated)]
    for index, field in enumerate(_FIELDS):
        position = 6 if field == "year" else index  # croniter's seventh field is the year
        alone = ["*", "*", "*", "*", "*", "0", "*"]
        alone[position] = translated[position]
        _check_field(text, field, " ".join(alone))
    years = [int(y) for y in _NUMBER.findall(named["year"])]
    if any(not YEARS[0] <= y <= YEARS[1] for y in years):
        raise invalid("expression", f"{text}: year is {YEARS[0]}-{YEARS[1]}")
    expression = " ".join(translated)
    _check_field(text, "", expression)
    return Expression(text, "cron", cron=expression)


# The range of each of croniter's seven fields as translated (day-of-week 0-6, the year croniter's).
_CRONITER_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6), (0, 59), (1970, 2099))

_TERM = re.compile(r"(\d+)(?:-(\d+))?(?:/(\d+))?")


def _single_values(part: str, low: int, high: int) -> str:
    """`part` with each comma-separated term that names a single value (`2-2`, `12/1` in
    months, `5-5/3`, `58/5` in minutes) written as that value; every other term as it is."""
    terms = []
    for term in part.split(","):
        match = _TERM.fullmatch(term)
        if match and (match.group(2) or match.group(3)):
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else high if match.group(3) else start
            step = int(match.group(3) or 1)
            if low <= start <= end <= high and step > 0 and start + step > end:
                term = str(start)
        terms.append(term)
    return ",".join(terms)


def _weekdays(text: str, dow: str) -> str:
    """EventBridge's day-of-week (1-7 = SUN-SAT) as croniter's (0-6 = sun-sat): each number
    less one, `xL` as `l<x-1>`, a lone `L` as Saturday; `#`'s count is left as it is."""
    if dow == "L":
        return "6"

    def day(number: str) -> str:
        n = int(number)
        if not 1 <= n <= 7:
            raise invalid("expression", f"{text}: day-of-week {n} is not 1-7 (SUN-SAT)")
        return str(n - 1)

    parts = []
    for part in dow.split(","):
        if last := re.fullmatch(r"(\d+|" + _DAYS + r")L", part):
            weekday = last.group(1)
            parts.append("l" + (day(weekday) if weekday.isdigit() else str(_DAYS.split("|").index(weekday))))
            continue
        head, hash_, nth = part.partition("#")
        head = _NUMBER.sub(lambda m: day(m.group(0)), head)
        head = _DAY_NAME.sub(lambda m: str(_DAYS.split("|").index(m.group(0))), head)
        parts.append(head + hash_ + nth)
    if any("#" in p for p in parts) and len(parts) > 1:
        raise invalid("expression", f"{text}: with '#' the day-of-week holds one expression only")
    return ",".join(parts)


def _check_field(text: str, field: str, expression: str) -> None:
    """croniter's verdict on `expression` (one field of ours among stars, or the whole),
    as a problem naming the field."""
    from croniter import CroniterError

    try:
        _croniter(expression, dt.datetime(2000, 1, 1))
    except (CroniterError, ValueError, KeyError, IndexError) as error:
        where = f"{field} " if field else ""
        reason = str(error).split("]")[-1].replace("is not acceptable", "").strip(" ,") or "not a value it takes"
        raise invalid("expression", f"{text}: {where}is not valid: {reason}") from None


def check_at(expression: Expression, tz: ZoneInfo, now: dt.datetime) -> None:
    """An `at(...)` names a time that exists in the zone and is still to come."""
    if expression.kind != "at" or expression.at is None:
        return
    instant = _instant(expression.at, tz)
    if instant is None:
        raise invalid("expression", f"{expression.text}: that time does not exist in {tz.key} (the clocks skip it)")
    if instant <= now:
        raise invalid("expression", f"{expression.text}: that time has passed in {tz.key}")


# -- when an expression fires ------------------------------------------------------------------


def _instant(wall: dt.datetime, tz: ZoneInfo) -> dt.datetime | None:
    """The UTC instant of a wall-clock time in `tz`: its first occurrence where the clocks
    repeat it, None where they skip it."""
    aware = wall.replace(tzinfo=tz, fold=0)
    instant = aware.astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) != wall:
        return None  # a time the clocks skip: it maps to another wall time
    return instant


def _wall(instant: dt.datetime, tz: ZoneInfo) -> dt.datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def minute(instant: dt.datetime) -> dt.datetime:
    """`instant` in UTC, to the whole minute (Scheduler's precision)."""
    return instant.astimezone(UTC).replace(second=0, microsecond=0)


def firings_after(expression: Expression, tz: ZoneInfo, after: dt.datetime, *, anchor: dt.datetime) -> Iterator[dt.datetime]:
    """The firings strictly after `after`, in order, as UTC instants (a rate counts from
    `anchor`); endless for a rate or a cron that keeps matching."""
    after = after.astimezone(UTC)
    if expression.kind == "rate":
        start = minute(anchor)
        k = max(1, int((after - start).total_seconds() // expression.every_s) + 1)
        while True:
            yield start + dt.timedelta(seconds=k * expression.every_s)
            k += 1
    if expression.kind == "at":
        instant = _instant(expression.at, tz) if expression.at else None
        if instant is not None and instant > after:
            yield instant
        return
    # A wall time's first occurrence comes no earlier than an earlier wall time's, so the
    # firings after `after` are the wall times after its own (those of a repeated hour that
    # came before it in time are passed over).
    from croniter import CroniterBadDateError

    itr = _croniter(expression.cron, _wall(after, tz))
    while True:
        try:
            wall = itr.get_next()
        except CroniterBadDateError:
            return
        instant = _instant(wall, tz)
        if instant is not None and instant > after:
            yield instant


def last_firing(
    expression: Expression, tz: ZoneInfo, until: dt.datetime, *, anchor: dt.datetime, since: dt.datetime
) -> Iterator[dt.datetime]:
    """The firings at or before `until` and strictly after `since`, newest first."""
    until, since = until.astimezone(UTC), since.astimezone(UTC)
    if expression.kind == "rate":
        start = minute(anchor)
        k = int((until - start).total_seconds() // expression.every_s)
        while k >= 1:
            at = start + dt.timedelta(seconds=k * expression.every_s)
            if at <= since:
                return
            yield at
            k -= 1
        return
    if expression.kind == "at":
        instant = _instant(expression.at, tz) if expression.at else None
        if instant is not None and since < instant <= until:
            yield instant
        return
    # Begin some wall clock late: just after the clocks go back, a repeated wall time later
    # than `until`'s came (its first occurrence) before `until`.
    from croniter import CroniterBadDateError

    itr = _croniter(expression.cron, _wall(until, tz) + _SHIFT)
    while True:
        try:
            wall = itr.get_prev()
        except CroniterBadDateError:
            return
        instant = _instant(wall, tz)
        if instant is None or instant > until:
            continue
        if instant <= since:  # the earlier a wall time, the earlier its first occurrence
            return
        yield instant


def next_firings(
    expression: Expression, tz: ZoneInfo, after: dt.datetime, count: int, *, anchor: dt.datetime
) -> list[dt.datetime]:
    """The next `count` firings after `after` (fewer when it stops firing)."""
    found: list[dt.datetime] = []
    for at in firings_after(expression, tz, after, anchor=anchor):
        found.append(at)
        if len(found) >= count:
            break
    return found


def utc_text(instant: dt.datetime) -> str:
    """An instant as the store keeps a scheduled time: UTC, to the second, `Z`."""
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def local_text(instant: dt.datetime, tz: ZoneInfo) -> str:
    """An instant on the zone's clock, with its offset (`2026-03-29T03:00:00+02:00`)."""
    return instant.astimezone(tz).isoformat(timespec="seconds")


def instant_of(text: str, field: str = "scheduled_at") -> dt.datetime:
    """An ISO-8601 instant (`2026-03-29T01:00:00Z`, or with an offset; a naive one is UTC),
    or `ExpressionInvalid` naming `field`."""
    try:
        parsed = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except (ValueError, AttributeError):
        raise invalid(field, f"{str(text)[:40]!r} is not an ISO-8601 time (e.g. 2026-03-29T07:00:00Z)") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
