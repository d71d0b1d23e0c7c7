"""EventBridge schedule expressions: what is refused (naming the field), and when what is
taken fires, in any zone, across the clocks' changes.

The property tests draw cron expressions as sets of values and write their text from them,
so the firings expected are the wall-clock minutes in those sets (walked minute by minute
in UTC, each read on the zone's clock: a time the clocks skip never comes, a time they
repeat counts once), never the expression read back by the code under test."""

from __future__ import annotations

import calendar
import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laneflow.domain import schedule_expressions as se

UTC = dt.UTC
ANCHOR = dt.datetime(2026, 1, 1, tzinfo=UTC)
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]


# -- expressions drawn as sets of values ----------------------------------------------------------


@st.composite
def field(draw: Any, low: int, high: int, names: list[str] | None = None, *, steps: bool = True) -> tuple[str, set[int]]:
    """One cron field: its text and the values it holds."""
    kind = draw(st.sampled_from(["star", "one", "list", "range", "step"] if steps else ["star", "one", "list", "range"]))
    if kind == "star":
        return "*", set(range(low, high + 1))
    if kind == "one":
        v = draw(st.integers(low, high))
        return _name(v, low, names, draw), {v}
    if kind == "list":
        values = sorted(draw(st.sets(st.integers(low, high), min_size=2, max_size=4)))
        return ",".join(_name(v, low, names, draw) for v in values), set(values)
    if kind == "range":
        a = draw(st.integers(low, high))
        b = draw(st.integers(a, high))
        return f"{_name(a, low, names, draw)}-{_name(b, low, names, draw)}", set(range(a, b + 1))
    start = draw(st.integers(low, high))
    step = draw(st.integers(1, max(1, high - low)))
    return f"{start}/{step}", set(range(start, high + 1, step))


def _name(value: int, low: int, names: list[str] | None, draw: Any) -> str:
    if names and draw(st.booleans()):
        return names[value - low]
    return str(value)


@st.composite
def cron(draw: Any) -> tuple[str, dict[str, Any]]:
    minutes = draw(field(0, 59))
    hours = draw(field(0, 23))
    months = draw(field(1, 12, MONTHS))
    year = draw(st.sampled_from([("*", None), ("2026", {2026}), ("2026-2027", {2026, 2027})]))
    if draw(st.booleans()):
        dom, dow = draw(field(1, 31)), ("?", None)
    else:
        dom, dow = ("?", None), draw(field(1, 7, DAYS, steps=False))
    text = f"cron({minutes[0]} {hours[0]} {dom[0]} {months[0]} {dow[0]} {year[0]})"
    sets = {"minute": minutes[1], "hour": hours[1], "dom": dom[1], "month": months[1], "dow": dow[1], "year": year[1]}
    return text, sets


def matches(wall: dt.datetime, sets: dict[str, Any]) -> bool:
    weekday = wall.isoweekday() % 7 + 1  # EventBridge's: 1 is Sunday
    return (
        wall.minute in sets["minute"]
        and wall.hour in sets["hour"]
        and wall.month in sets["month"]
        and (sets["year"] is None or wall.year in sets["year"])
        and (sets["dom"] is None or wall.day in sets["dom"])
        and (sets["dow"] is None or weekday in sets["dow"])
    )


def expected_firings(sets: dict[str, Any], zone: Any, start: dt.datetime, minutes: int) -> list[dt.datetime]:
    found = []
    for k in range(1, minutes + 1):
        at = start + dt.timedelta(minutes=k)
        local = at.astimezone(zone)
        if local.fold:  # the clocks went back: this wall time came once already, and fires once
            continue
        if matches(local.replace(tzinfo=None), sets):
            found.append(at)
    return found


# Zones whose clocks change, each from half a day before a change (Lord Howe's move by half
# an hour); and any zone of the database at ordinary times.
AROUND_CHANGES = [
    ("Europe/Berlin", dt.datetime(2026, 3, 28, 13, tzinfo=UTC)),
    ("Europe/Berlin", dt.datetime(2026, 10, 24, 13, tzinfo=UTC)),
    ("America/New_York", dt.datetime(2026, 3, 7, 19, tzinfo=UTC)),
    ("America/New_York", dt.datetime(2026, 10, 31, 18, tzinfo=UTC)),
    ("Australia/Sydney", dt.datetime(2026, 4, 4, 4, tzinfo=UTC)),
    ("Australia/Sydney", dt.datetime(2026, 10, 3, 4, tzinfo=UTC)),
    ("Australia/Lord_Howe", dt.datetime(2026, 4, 4, 3, tzinfo=UTC)),
    ("Australia/Lord_Howe", dt.datetime(2026, 10, 3, 4, tzinfo=UTC)),
]
ORDINARY = [dt.datetime(2026, 6, 15, 0, tzinfo=UTC), dt.datetime(2026, 12, 31, 6, tzinfo=UTC)]

where = st.one_of(
    st.sampled_from(AROUND_CHANGES),
    st.tuples(st.timezone_keys(allow_prefix=False), st.sampled_from(ORDINARY)),
)

WINDOW = 26 * 60  # minutes walked per example


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=cron(), place=where)
def test_a_cron_fires_at_exactly_the_wall_clock_minutes_it_names_in_any_zone(
    drawn: tuple[str, dict[str, Any]], place: tuple[str, dt.datetime]
) -> None:
    text, sets = drawn
    zone_name, start = place
    zone = se.zone(zone_name)
    expression = se.parse(text)
    expected = expected_firings(sets, zone, start, WINDOW)
    got = se.next_firings(expression, zone, start, len(expected) + 1, anchor=ANCHOR)
    end = start + dt.timedelta(minutes=WINDOW)
    assert [at for at in got if at <= end] == expected, (text, zone_name)
    assert all(at > end for at in got[len(expected) :])
    # ...and walking back from the window's end finds the same firings, newest first.
    back = list(se.last_firing(expression, zone, end, anchor=ANCHOR, since=start))
    assert back == expected[::-1], (text, zone_name)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_any_text_is_taken_or_refused_naming_the_expression(text: str) -> None:
    try:
        se.parse(text)
    except se.ExpressionInvalid as refused:
        assert [p.field for p in refused.problems] == ["expression"]


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        lambda fields: f"cron({' '.join(fields)})",
        st.lists(
            st.sampled_from(["*", "?", "0", "7", "1-5", "L", "6L", "2#1", "15W", "MON", "*/5", "0/15", "x", "99"]),
            min_size=5,
            max_size=7,
        ),
    )
)
def test_cron_texts_made_of_fragments_are_taken_only_when_valid_and_fire_when_taken(text: str) -> None:
    try:
        expression = se.parse(text)
    except se.ExpressionInvalid as refused:
        assert [p.field for p in refused.problems] == ["expression"]
        return
    fields = text[5:-1].split()
    assert len(fields) == 6 and (fields[2] == "?") != (fields[4] == "?")
    se.next_firings(expression, se.zone("UTC"), ANCHOR, 2, anchor=ANCHOR)  # computes, whatever it finds


@settings(max_examples=100, deadline=None)
@given(st.timezone_keys(allow_prefix=False))
def test_every_zone_the_database_has_is_taken_and_a_daily_cron_fires_at_its_wall_time_there(name: str) -> None:
    zone = se.zone(name)
    for at in se.next_firings(se.parse("cron(0 7 * * ? *)"), zone, ANCHOR, 5, anchor=ANCHOR):
        assert at.astimezone(zone).strftime("%H:%M") == "07:00"


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40).filter(lambda t: t not in se.zone_names()))
def test_a_zone_the_database_lacks_is_refused_naming_the_timezone(name: str) -> None:
    try:
        se.zone(name)
    except se.ExpressionInvalid as refused:
        assert [p.field for p in refused.problems] == ["timezone"]
    else:  # a name the database resolves without listing it (a case variant)
        pass


@settings(max_examples=100, deadline=None)
@given(value=st.integers(1, 500), unit=st.sampled_from(["minute", "hour", "day"]), offset=st.integers(0, 10_000_000))
def test_a_rate_fires_every_period_from_its_anchor(value: int, unit: str, offset: int) -> None:
    text = f"rate({value} {unit}{'s' if value > 1 else ''})"
    period = value * {"minute": 60, "hour": 3600, "day": 86400}[unit]
    after = ANCHOR + dt.timedelta(seconds=offset)
    got = se.next_firings(se.parse(text), se.zone("Europe/Berlin"), after, 3, anchor=ANCHOR)
    k = offset // period + 1
    assert got == [ANCHOR + dt.timedelta(seconds=(k + i) * period) for i in range(3)]


# -- what EventBridge's own words mean ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field_said"),
    [
        ("cron(0 7 * * * *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 7 ? * ? *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 7 * * ?)", "six fields"),
        ("cron(61 7 * * ? *)", "minutes"),
        ("cron(0 24 * * ? *)", "hours"),
        ("cron(0 7 32 * ? *)", "day-of-month"),
        ("cron(0 7 * 13 ? *)", "month"),
        ("cron(0 7 ? * 0 *)", "day-of-week 0 is not 1-7"),
        ("cron(0 7 ? * 8 *)", "day-of-week 8 is not 1-7"),
        ("cron(0 7 * * ? 2300)", "year"),
        ("cron(H 7 * * ? *)", "minutes 'H'"),
        ("cron(0 7 ? * 2#1,3#2 *)", "'#'"),
        ("rate(1 minutes)", "rate(1 minute)"),
        ("rate(5 minute)", "rate(5 minutes)"),
        ("rate(0 hours)", "from 1"),
        ("rate(2 weeks)", "minute(s), hour(s) or day(s)"),
        ("at(2026-02-30T07:00:00)", "not a date"),
        ("every day at seven", "rate(15 minutes)"),
    ],
)
def test_an_expression_eventbridge_would_refuse_is_refused_saying_what_is_wrong(text: str, field_said: str) -> None:
    with pytest.raises(se.ExpressionInvalid, match="^expression: ") as refused:
        se.parse(text)
    assert field_said in str(refused.value)
    assert [p.field for p in refused.value.problems] == ["expression"]


def _firings(text: str, zone: str, after: dt.datetime, count: int) -> list[str]:
    z = se.zone(zone)
    return [se.local_text(at, z) for at in se.next_firings(se.parse(text), z, after, count, anchor=ANCHOR)]


def test_day_of_week_counts_from_sunday_as_one_and_takes_names() -> None:
    monday = dt.datetime(2026, 6, 1, tzinfo=UTC)  # a Monday
    assert _firings("cron(0 9 ? * 1 *)", "UTC", monday, 1) == ["2026-06-07T09:00:00+00:00"]  # Sunday
    assert _firings("cron(0 9 ? * 7 *)", "UTC", monday, 1) == ["2026-06-06T09:00:00+00:00"]  # Saturday
    assert _firings("cron(0 9 ? * MON-FRI *)", "UTC", monday, 5)[-1] == "2026-06-05T09:00:00+00:00"
    assert _firings("cron(0 9 ? * 2-6 *)", "UTC", monday, 5) == _firings("cron(0 9 ? * MON-FRI *)", "UTC", monday, 5)


def _last_weekday(year: int, month: int, weekday: int) -> int:
    days = calendar.monthrange(year, month)[1]
    return max(d for d in range(1, days + 1) if dt.date(year, month, d).weekday() == weekday)


def test_l_w_and_hash_fire_on_the_days_the_calendar_gives() -> None:
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    last_fridays = [f"2026-{m:02d}-{_last_weekday(2026, m, calendar.FRIDAY):02d}T12:00:00+00:00" for m in range(1, 7)]
    assert _firings("cron(0 12 ? * 6L *)", "UTC", start, 6) == last_fridays
    assert _firings("cron(0 0 L * ? *)", "UTC", start, 3) == [
        "2026-01-31T00:00:00+00:00",
        "2026-02-28T00:00:00+00:00",
        "2026-03-31T00:00:00+00:00",
    ]
    # 2#1: the first Monday of each month.
    assert _firings("cron(0 9 ? * 2#1 *)", "UTC", start, 3) == [
        "2026-01-05T09:00:00+00:00",
        "2026-02-02T09:00:00+00:00",
        "2026-03-02T09:00:00+00:00",
    ]
    # 15W: the weekday nearest the 15th (2026-02-15 is a Sunday, 2026-08-15 a Saturday).
    assert _firings("cron(0 0 15W 2 ? *)", "UTC", start, 1) == ["2026-02-16T00:00:00+00:00"]
    assert _firings("cron(0 0 15W 8 ? *)", "UTC", start, 1) == ["2026-08-14T00:00:00+00:00"]


def test_a_time_the_clocks_skip_does_not_fire_and_one_they_repeat_fires_once() -> None:
    # Berlin: 02:00 became 03:00 on 2026-03-29, and 03:00 went back to 02:00 on 2026-10-25.
    spring = dt.datetime(2026, 3, 28, 12, tzinfo=UTC)
    assert _firings("cron(30 2 * * ? *)", "Europe/Berlin", spring, 2) == [
        "2026-03-30T02:30:00+02:00",  # none on the 29th: 02:30 never came
        "2026-03-31T02:30:00+02:00",
    ]
    autumn = dt.datetime(2026, 10, 24, 12, tzinfo=UTC)
    assert _firings("cron(30 2 * * ? *)", "Europe/Berlin", autumn, 2) == [
        "2026-10-25T02:30:00+02:00",  # the first 02:30, not the second
        "2026-10-26T02:30:00+01:00",
    ]
    assert _firings("cron(0 * * * ? *)", "Europe/Berlin", dt.datetime(2026, 10, 24, 23, 30, tzinfo=UTC), 3) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T03:00:00+01:00",  # 02:00 again came and did not fire
        "2026-10-25T04:00:00+01:00",
    ]


def test_an_at_fires_once_on_its_zones_clock_and_not_at_all_once_past() -> None:
    at = se.parse("at(2026-12-24T06:00:00)")
    berlin = se.zone("Europe/Berlin")
    assert se.next_firings(at, berlin, ANCHOR, 3, anchor=ANCHOR) == [dt.datetime(2026, 12, 24, 5, tzinfo=UTC)]
    assert se.next_firings(at, berlin, dt.datetime(2026, 12, 24, 5, tzinfo=UTC), 3, anchor=ANCHOR) == []
    with pytest.raises(se.ExpressionInvalid, match="has passed"):
        se.check_at(at, berlin, dt.datetime(2027, 1, 1, tzinfo=UTC))
    with pytest.raises(se.ExpressionInvalid, match="does not exist"):
        se.check_at(se.parse("at(2026-03-29T02:30:00)"), berlin, ANCHOR)


@pytest.mark.parametrize("name", ["", "Nowhere/Zone", "../../etc/passwd", "/etc/localtime", "Europe/Berlin\x00"])
def test_a_bad_zone_is_refused_naming_the_timezone(name: str) -> None:
    with pytest.raises(se.ExpressionInvalid, match="^timezone: ") as refused:
        se.zone(name)
    assert [p.field for p in refused.value.problems] == ["timezone"]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("cron(* * ? 12/1 * *)", dt.datetime(2026, 11, 30, 23, 0, tzinfo=UTC)),  # December only, not every month
        ("cron(58/5 * * * ? *)", dt.datetime(2026, 3, 28, 13, 58, tzinfo=UTC)),  # minute 58 only
        ("cron(0 5-5/2 * * ? *)", dt.datetime(2026, 3, 29, 3, 0, tzinfo=UTC)),  # 05:00 only (CEST from the 29th)
    ],
)
def test_a_term_that_names_one_value_fires_at_that_value_only(text: str, first: dt.datetime) -> None:
    # croniter reads a one-value range or step as every value: the translation writes the value.
    got = se.next_firings(se.parse(text), se.zone("Europe/Berlin"), dt.datetime(2026, 3, 28, 13, 0, tzinfo=UTC), 2, anchor=ANCHOR)
    assert got[0] == first
