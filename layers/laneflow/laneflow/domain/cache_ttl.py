"""Which TTL a step's prompt-cache writes ask for: `cache_ttl: 5m | 1h | auto` (agent.md, else
AGENTS.md; default `auto`).

A 5-minute entry costs 1.25x the input price to write, a 1-hour entry 2x (the catalog's
`cache_write_5m` and `cache_write_1h`); reads cost the same either way, and every read starts
the entry's TTL again. So the 1-hour write is worth it exactly when the prefix's next read is
expected after a 5-minute entry would have gone and before a 1-hour one would: then it saves
writing the prefix again, and one avoided rewrite (1.25x) pays its extra 0.75x.

`auto` looks for such a read (`TtlSignals`): a lane's later waves starting long after its
lead, an evaluator loop whose cycles are long, a run that parks for a person between two uses
of the agent, a flow started every 5 to 60 minutes, a prefix whose uses come that far apart.
The run-level signals are worked out once as the run starts and kept in
`run.options["cache_ttl"]` (usecases/cache_ttl.py); the step adds the prefix registry's gap
since the prefix's last use (`choose_for`).

Times are the cache clock's (laneflow.domain.cache): what a benchmark speeds up, the TTLs run
by too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, get_args

from laneflow.domain.pricing import Price, PriceCatalog, catalog
from laneflow.domain.workspace_settings import CacheTtlSetting

__all__ = [
    "CACHE_TTL_OPTION",
    "SETTINGS",
    "DEFAULT_SETTING",
    "DURATION_AFTER_S",
    "GAP_AFTER_S",
    "WITHIN_S",
    "DESIGN_WRITE_5M",
    "DESIGN_WRITE_1H",
    "TtlSignals",
    "choose_ttl",
    "choose_for",
    "signals_of",
    "pays",
]

CACHE_TTL_OPTION = "cache_ttl"  # the run option: {agent: {"setting", "where", signals...}}

SETTINGS: tuple[str, ...] = get_args(CacheTtlSetting)  # "5m", "1h", "auto"
DEFAULT_SETTING = "auto"

# A duration measured from the prefix's write to its next read (a lane's next wave, a loop's
# next cycle) past this one calls for the 1-hour entry: 4 minutes, not 5, because the figure
# is an estimate from earlier steps (a median, a previous cycle), and the registry counts a
# 5-minute entry warm only until 30 s before it expires; a step a minute slower than its
# median would otherwise find the entry gone.
DURATION_AFTER_S = 240.0

# A gap between two uses (the flow's starts, the prefix's last use) past this one calls for
# the 1-hour entry: a gap under 5 minutes is one the 5-minute entry covers already, since each
# use starts its TTL again.
GAP_AFTER_S = 300.0

# A read expected later than this finds even a 1-hour entry gone: writing it would pay 2x for
# nothing, so such a read calls for the 5-minute entry.
WITHIN_S = 3600.0

# What a write costs as a multiple of the input price, for a model the catalog has no price
# for (the stub): Anthropic's published multipliers, as prices.json's own entries have them.
DESIGN_WRITE_5M = 1.25
DESIGN_WRITE_1H = 2.0


@dataclass(frozen=True)
class TtlSignals:
    """What `auto` looks at: when the prefix a step writes is expected to be read next.
    Each is None (or False) when it is not known or does not apply. Seconds on the cache clock."""

    # Seconds from a lane's lead starting to its next wave starting: only for a lane of more
    # steps than its `parallel:` (the expected step duration, from the flow's previous run).
    later_wave_s: float | None = None
    # How long the last cycle of the evaluator loop this agent is in took (the previous run's).
    loop_cycle_s: float | None = None
    # The run parks for an approval after this agent's step, and the agent runs again after it.
    parks_for_approval: bool = False
    # Seconds since the prefix was last written or read (the prefix registry), when it is no
    # longer warm.
    last_use_gap_s: float | None = None
    # Seconds between the flow's last two starts.
    flow_start_gap_s: float | None = None


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes >= 10 else f"{minutes:.1f} min"


def _place(seconds: float | None, after: float, words: str, within: list[str], past: list[str]) -> None:
    """Put one measured signal among the reads expected within the hour or past it."""
    if seconds is None or not math.isfinite(seconds) or seconds <= after:
        return
    (past if seconds > WITHIN_S else within).append(words.format(_minutes(seconds)))


def _expected_reads(signals: TtlSignals) -> tuple[list[str], list[str]]:
    """(why a read is expected after 5 minutes and within the hour, why one is expected only
    after the hour), each in words, in the order the signals are listed."""
    within: list[str] = []
    past: list[str] = []
    _place(signals.later_wave_s, DURATION_AFTER_S, "the lane's later waves start ~{} after its lead", within, past)
    _place(signals.loop_cycle_s, DURATION_AFTER_S, "the loop's last cycle took {}", within, past)
    if signals.parks_for_approval:
        within.append("the run parks for an approval before the agent runs again")
    _place(signals.flow_start_gap_s, GAP_AFTER_S, "the flow's last starts were {} apart", within, past)
    _place(signals.last_use_gap_s, GAP_AFTER_S, "the prefix was last used {} ago", within, past)
    return within, past


def _ratios(price: Price | None) -> tuple[float, float]:
    """(5-minute write, 1-hour write) as multiples of the input price."""
    if price is None or price.input <= 0:
        return DESIGN_WRITE_5M, DESIGN_WRITE_1H
    return price.cache_write_5m / price.input, price.cache_write_1h / price.input


def pays(price: Price | None) -> bool:
    """Whether one 1-hour write costs less than what it replaces when the next read comes after
    a 5-minute entry has gone: the 5-minute write and the rewrite it then needs. At the
    catalog's prices 2x < 2 x 1.25x, for every model; a model without a price (the stub) is
    taken at those ratios."""
    write_5m, write_1h = _ratios(price)
    return write_1h < 2 * write_5m


def choose_ttl(
    setting: str, model: str, signals: TtlSignals, *, where: str | None = None, prices: PriceCatalog | None = None
) -> tuple[str, str]:
    """The TTL a step's cache writes ask for ("5m" or "1h") and why (its `cache_ttl_reason`).

    `setting` is the agent's `cache_ttl` (`where`: the file that set it; None, the default);
    an explicit `5m` or `1h` is taken as it is. `auto` chooses "1h" when some signal expects
    the prefix's next read after 5 minutes and within the hour and the 1-hour write pays at
    the catalog's price of `model` (`prices`, the catalog by default), else "5m". A setting
    that is none of these is a ValueError (the settings' check refuses it before a run)."""
    if setting in ("5m", "1h"):
        return setting, f"cache_ttl: {setting} in {where or 'the settings'}"
    if setting != "auto":
        raise ValueError(f"cache_ttl is one of {', '.join(SETTINGS)}, not {setting!r}")
    within, past = _expected_reads(signals)
    if not within:
        if past:
            return "5m", f"auto: no read expected within the hour ({past[0]}), past even a 1-hour entry"
        return "5m", "auto: no read expected after 5 minutes"
    price = (prices or catalog()).price(model)
    write_5m, write_1h = _ratios(price)
    if not pays(price):
        return "5m", (
            f"auto: {within[0]}, but at {model}'s prices one 1-hour write ({write_1h:g}x input) costs"
            f" no less than two 5-minute ones (2 x {write_5m:g}x)"
        )
    return (
        "1h",
        f"auto: {within[0]}; one 1-hour write ({write_1h:g}x input) costs less than two 5-minute ones (2 x {write_5m:g}x)",
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _recorded(options: dict[str, Any], agent: str) -> dict[str, Any] | None:
    """The agent's entry in the run's `cache_ttl` option, if the start recorded one."""
    found = options.get(CACHE_TTL_OPTION)
    entry = found.get(agent) if isinstance(found, dict) else None
    return entry if isinstance(entry, dict) else None


def signals_of(options: dict[str, Any], agent: str) -> tuple[str, TtlSignals]:
    """(setting, signals) of an agent as the run's start recorded them in its options. An agent
    the start did not record (a run started before the setting existed) is `auto` with no
    signal; a value that does not read as one is taken as unknown."""
    entry = _recorded(options, agent)
    if entry is None:
        return DEFAULT_SETTING, TtlSignals()
    setting = entry.get("setting")
    return (
        setting if setting in SETTINGS else DEFAULT_SETTING,
        TtlSignals(
            later_wave_s=_seconds(entry.get("later_wave_s")),
            loop_cycle_s=_seconds(entry.get("loop_cycle_s")),
            parks_for_approval=entry.get("parks_for_approval") is True,
            flow_start_gap_s=_seconds(entry.get("flow_start_gap_s")),
        ),
    )


def choose_for(options: dict[str, Any], agent: str, model: str, *, last_use_gap_s: float | None = None) -> tuple[str, str]:
    """`choose_ttl` for a step of `agent` on `model`: its setting and signals as the run's start
    recorded them (`signals_of`), and the registry's gap since its prefix's last use, when the
    prefix is no longer warm."""
    setting, signals = signals_of(options, agent)
    where = (_recorded(options, agent) or {}).get("where")
    if last_use_gap_s is not None:
        signals = replace(signals, last_use_gap_s=last_use_gap_s)
    return choose_ttl(setting, model, signals, where=where if isinstance(where, str) else None)
