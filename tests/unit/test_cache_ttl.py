"""The prompt-cache TTL choice (`cache_ttl: 5m | 1h | auto`): the setting as agent.md and
AGENTS.md give it, `auto`'s rule on each signal, the price rule, and reading the signals back
from a run's options."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from laneflow.domain.cache_ttl import (
    CACHE_TTL_OPTION,
    TtlSignals,
    choose_for,
    choose_ttl,
    pays,
    signals_of,
)
from laneflow.domain.errors import WorkspaceInvalid
from laneflow.domain.flow import check_workspace
from laneflow.domain.pricing import Price, PriceCatalog, catalog
from laneflow.domain.workspace import load_agent, load_workspace

MIN = 60.0
SONNET = "claude-sonnet-4-6"


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


# --------------------------------------------------------------------------- the setting


def test_agent_setting_is_read_and_agents_md_gives_the_default(tmp_path: Path) -> None:
    ws_root = write(
        tmp_path / "ws",
        {
            "AGENTS.md": "---\ncache_ttl: 1h\n---\n",
            "agents/a/agent.md": "---\ncache_ttl: 5m\n---\npersona",
            "agents/b/agent.md": "persona",
        },
    )
    ws = load_workspace(ws_root)
    assert ws.settings.cache_ttl == "1h"
    assert load_agent(ws, "a").settings.cache_ttl == "5m"
    assert load_agent(ws, "b").settings.cache_ttl is None  # AGENTS.md's applies


def test_without_any_setting_the_workspace_default_is_auto(tmp_path: Path) -> None:
    ws = load_workspace(write(tmp_path / "ws", {"AGENTS.md": "", "agents/a/agent.md": "persona"}))
    assert ws.settings.cache_ttl == "auto"
    assert "cache_ttl" not in ws.settings.model_fields_set


def test_a_bad_agent_setting_is_an_error_naming_the_file_line_and_field(tmp_path: Path) -> None:
    ws_root = write(tmp_path / "ws", {"AGENTS.md": "", "agents/a/agent.md": "---\nmodel: stub\ncache_ttl: 10m\n---\npersona"})
    with pytest.raises(WorkspaceInvalid) as e:
        load_agent(load_workspace(ws_root), "a")
    [problem] = e.value.problems
    assert (problem.file, problem.line, problem.field) == ("agents/a/agent.md", 3, "cache_ttl")
    assert problem.message == "expected one of '5m', '1h', 'auto', got a string ('10m')"


def test_a_bad_agents_md_setting_is_an_error_naming_the_file_line_and_field(tmp_path: Path) -> None:
    ws_root = write(tmp_path / "ws", {"AGENTS.md": "---\ncache_ttl: 300\n---\n"})
    with pytest.raises(WorkspaceInvalid) as e:
        load_workspace(ws_root)
    [problem] = e.value.problems
    assert (problem.file, problem.line, problem.field) == ("AGENTS.md", 2, "cache_ttl")
    assert "one of '5m', '1h', 'auto'" in problem.message and "300" in problem.message


def test_laneflow_check_lists_a_bad_setting_beside_the_files_other_problems(tmp_path: Path) -> None:
    ws_root = write(tmp_path / "ws", {"AGENTS.md": "", "agents/a/agent.md": "---\ncache_ttl: 1 hour\nbudget: '3'\n---\n"})
    found = {(p.file, p.field) for p in check_workspace(ws_root) if p.severity == "error"}
    assert found == {("agents/a/agent.md", "cache_ttl"), ("agents/a/agent.md", "budget")}


# --------------------------------------------------------------------------- explicit


@pytest.mark.parametrize("setting", ["5m", "1h"])
def test_an_explicit_setting_is_taken_whatever_the_signals(setting: str) -> None:
    expecting = TtlSignals(flow_start_gap_s=20 * MIN)
    assert choose_ttl(setting, SONNET, expecting, where="agents/a/agent.md") == (
        setting,
        f"cache_ttl: {setting} in agents/a/agent.md",
    )


def test_explicit_5m_stays_5m_where_auto_would_write_for_an_hour() -> None:
    expecting = TtlSignals(later_wave_s=10 * MIN, parks_for_approval=True)
    assert choose_ttl("auto", SONNET, expecting)[0] == "1h"
    assert choose_ttl("5m", SONNET, expecting, where="AGENTS.md") == ("5m", "cache_ttl: 5m in AGENTS.md")


def test_a_setting_that_is_none_of_the_three_is_refused() -> None:
    with pytest.raises(ValueError, match="not '10m'"):
        choose_ttl("10m", SONNET, TtlSignals())


# --------------------------------------------------------------------------- auto, per signal


def test_auto_without_signals_writes_for_5_minutes() -> None:
    assert choose_ttl("auto", SONNET, TtlSignals()) == ("5m", "auto: no read expected after 5 minutes")


def test_later_waves_past_4_minutes_after_the_lead_write_for_an_hour() -> None:
    ttl, reason = choose_ttl("auto", SONNET, TtlSignals(later_wave_s=6 * MIN))
    assert ttl == "1h"
    assert "later waves start ~6.0 min after its lead" in reason


def test_later_waves_within_4_minutes_write_for_5_minutes() -> None:
    assert choose_ttl("auto", SONNET, TtlSignals(later_wave_s=3.5 * MIN))[0] == "5m"


def test_a_loop_whose_last_cycle_took_over_4_minutes_writes_for_an_hour() -> None:
    ttl, reason = choose_ttl("auto", SONNET, TtlSignals(loop_cycle_s=4.5 * MIN))
    assert (ttl, "the loop's last cycle took 4.5 min" in reason) == ("1h", True)
    assert choose_ttl("auto", SONNET, TtlSignals(loop_cycle_s=3 * MIN))[0] == "5m"


def test_a_run_parked_for_approval_between_uses_writes_for_an_hour() -> None:
    ttl, reason = choose_ttl("auto", SONNET, TtlSignals(parks_for_approval=True))
    assert ttl == "1h" and "parks for an approval" in reason


def test_flow_starts_5_to_60_minutes_apart_write_for_an_hour() -> None:
    for gap in (5.5 * MIN, 20 * MIN, 59 * MIN):
        ttl, reason = choose_ttl("auto", SONNET, TtlSignals(flow_start_gap_s=gap))
        assert ttl == "1h", gap
        assert "the flow's last starts were" in reason


def test_flow_starts_3_minutes_apart_write_for_5_minutes() -> None:
    assert choose_ttl("auto", SONNET, TtlSignals(flow_start_gap_s=3 * MIN)) == ("5m", "auto: no read expected after 5 minutes")


def test_flow_starts_2_hours_apart_write_for_5_minutes_and_say_the_hour_is_passed() -> None:
    ttl, reason = choose_ttl("auto", SONNET, TtlSignals(flow_start_gap_s=120 * MIN))
    assert ttl == "5m"
    assert (
        reason == "auto: no read expected within the hour (the flow's last starts were 120 min apart), past even a 1-hour entry"
    )


def test_a_last_use_5_to_60_minutes_ago_writes_for_an_hour() -> None:
    ttl, reason = choose_ttl("auto", SONNET, TtlSignals(last_use_gap_s=12 * MIN))
    assert ttl == "1h" and "the prefix was last used 12 min ago" in reason


def test_a_last_use_3_minutes_or_2_hours_ago_writes_for_5_minutes() -> None:
    assert choose_ttl("auto", SONNET, TtlSignals(last_use_gap_s=3 * MIN))[0] == "5m"
    assert choose_ttl("auto", SONNET, TtlSignals(last_use_gap_s=120 * MIN))[0] == "5m"


def test_one_signal_within_the_hour_is_enough_beside_others_that_are_not() -> None:
    mixed = TtlSignals(later_wave_s=30.0, flow_start_gap_s=3 * 3600.0, loop_cycle_s=8 * MIN)
    ttl, reason = choose_ttl("auto", SONNET, mixed)
    assert ttl == "1h" and "loop's last cycle took 8.0 min" in reason


# --------------------------------------------------------------------------- the price rule


def test_at_the_catalogs_prices_an_hour_write_pays_for_every_model() -> None:
    # 2x the input price against 2 x 1.25x: one avoided rewrite pays for it.
    models = ["claude-opus-4-6", "claude-sonnet-4-5", "claude-haiku-4-5", "claude-3-haiku"]
    for model in models:
        price = catalog().price(model)
        assert price is not None and pays(price), model
    ttl, reason = choose_ttl("auto", "claude-haiku-4-5", TtlSignals(flow_start_gap_s=20 * MIN))
    assert ttl == "1h"
    assert "one 1-hour write (2x input) costs less than two 5-minute ones (2 x 1.25x)" in reason


def test_the_stub_has_no_price_and_is_taken_at_the_published_ratios() -> None:
    assert catalog().price("stub") is None and pays(None)
    assert choose_ttl("auto", "stub", TtlSignals(parks_for_approval=True))[0] == "1h"


def test_where_an_hour_write_does_not_pay_auto_writes_for_5_minutes() -> None:
    # A hypothetical price: a 1-hour write at 3x the input price, more than two 5-minute ones.
    dear = Price(input=3.0, output=15.0, cache_write_5m=3.75, cache_write_1h=9.0, cache_read=0.3)
    prices = PriceCatalog({"claude-dear": dear})
    assert not pays(dear)
    ttl, reason = choose_ttl("auto", "claude-dear", TtlSignals(flow_start_gap_s=20 * MIN), prices=prices)
    assert ttl == "5m"
    assert reason == (
        "auto: the flow's last starts were 20 min apart, but at claude-dear's prices one 1-hour write"
        " (3x input) costs no less than two 5-minute ones (2 x 1.25x)"
    )
    # The same price, just below two 5-minute writes, pays.
    cheaper = replace(dear, cache_write_1h=7.4)
    assert (
        choose_ttl("auto", "claude-dear", TtlSignals(flow_start_gap_s=20 * MIN), prices=PriceCatalog({"claude-dear": cheaper}))[0]
        == "1h"
    )


# --------------------------------------------------------------------------- the run's options


def test_signals_are_read_back_from_the_runs_options() -> None:
    options = {
        CACHE_TTL_OPTION: {
            "writer": {
                "setting": "auto",
                "where": None,
                "later_wave_s": 310.5,
                "loop_cycle_s": None,
                "parks_for_approval": True,
                "flow_start_gap_s": 61.0,
            },
            "checker": {"setting": "1h", "where": "agents/checker/agent.md"},
        }
    }
    assert signals_of(options, "writer") == (
        "auto",
        TtlSignals(later_wave_s=310.5, parks_for_approval=True, flow_start_gap_s=61.0),
    )
    assert signals_of(options, "checker") == ("1h", TtlSignals())
    assert choose_for(options, "checker", SONNET) == ("1h", "cache_ttl: 1h in agents/checker/agent.md")


def test_an_agent_the_start_did_not_record_is_auto_without_signals() -> None:
    assert signals_of({}, "writer") == ("auto", TtlSignals())
    assert signals_of({CACHE_TTL_OPTION: {"writer": {"setting": "2h", "later_wave_s": "soon"}}}, "writer") == (
        "auto",
        TtlSignals(),
    )


def test_the_steps_last_use_gap_joins_what_the_start_recorded() -> None:
    options = {CACHE_TTL_OPTION: {"writer": {"setting": "auto", "flow_start_gap_s": 30.0}}}
    assert choose_for(options, "writer", SONNET)[0] == "5m"
    ttl, reason = choose_for(options, "writer", SONNET, last_use_gap_s=15 * MIN)
    assert ttl == "1h" and "last used 15 min ago" in reason
