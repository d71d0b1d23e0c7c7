"""The warm gate's pass and hand-back rules, over plain values (each store keeps the gate
its own way and asks these who passes and who is handed back)."""

from __future__ import annotations

import pytest

from laneflow.domain.gate import GateWaiter, hand_back, lets_pass, releases

SIBLING = GateWaiter(token="sibling", index=2)
RESERVE = GateWaiter(token="reserve", index=3, until_lead_ends=True)


@pytest.mark.parametrize(
    ("opened", "lead_ended", "sibling", "reserve"),
    [
        (False, False, False, False),  # the lead's reply has not begun: everyone waits
        (True, False, True, False),  # the reply began: siblings start, the reserve keeps the lead's slot
        (True, True, True, True),  # the lead ended: everyone starts
    ],
)
def test_a_sibling_passes_once_the_gate_opened_and_the_reserve_once_the_lead_ended(
    opened: bool, lead_ended: bool, sibling: bool, reserve: bool
) -> None:
    assert lets_pass(SIBLING, opened=opened, lead_ended=lead_ended) is sibling
    assert lets_pass(RESERVE, opened=opened, lead_ended=lead_ended) is reserve


def test_an_opening_releases_whoever_it_lets_pass() -> None:
    assert releases(SIBLING, lead_ended=False) and releases(SIBLING, lead_ended=True)
    assert not releases(RESERVE, lead_ended=False) and releases(RESERVE, lead_ended=True)


def test_the_reply_hands_back_the_siblings_in_the_order_kept_and_leaves_the_reserve_waiting() -> None:
    other = GateWaiter(token="other")  # a waiter that did not say its index is a sibling too
    handed, left = hand_back([SIBLING, RESERVE, other], lead_ended=False)
    assert handed == [SIBLING, other]
    assert left == [RESERVE]


def test_the_lead_s_end_hands_back_everyone_kept() -> None:
    assert hand_back([RESERVE, SIBLING], lead_ended=True) == ([RESERVE, SIBLING], [])
    assert hand_back([], lead_ended=True) == ([], [])
