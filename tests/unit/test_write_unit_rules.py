"""The write meter's arithmetic (laneflow_dev.capacity): item sizes by DynamoDB's documented
rules, a write's units per started KB, and what a secondary index's entry costs."""

from __future__ import annotations

from laneflow_dev.capacity import Index, item_size, number_size, value_size, write_units


def test_a_string_counts_its_utf8_bytes_and_its_name() -> None:
    assert item_size({"pk": {"S": "abc"}}) == 2 + 3
    assert item_size({"é": {"S": "ü€"}}) == 2 + 2 + 3  # a name is UTF-8 too


def test_a_number_counts_a_byte_per_two_significant_digits_and_one() -> None:
    assert number_size("12345") == 3 + 1
    assert number_size("100") == 1 + 1  # trailing zeros trimmed
    assert number_size("0.0012") == 1 + 1  # leading zeros trimmed: "12"
    assert number_size("-3.14") == 2 + 1  # "314"
    assert number_size("0") == 0 + 1
    assert item_size({"n": {"N": "1796357445838"}}) == 1 + 7 + 1


def test_binary_booleans_and_nulls() -> None:
    assert value_size({"B": b"\x00\x01\x02"}) == 3
    assert value_size({"B": "AAEC"}) == 3  # as the wire carries it, base64: its raw bytes count
    assert value_size({"BOOL": False}) == value_size({"NULL": True}) == 1


def test_a_list_or_a_map_costs_three_bytes_and_one_per_element() -> None:
    assert value_size({"M": {}}) == value_size({"L": []}) == 3
    assert value_size({"M": {"a": {"S": "bc"}}}) == 3 + (1 + 2 + 1)  # the key counts as a name
    assert value_size({"L": [{"S": "x"}, {"N": "1"}]}) == 3 + (1 + 1) + (2 + 1)
    assert value_size({"M": {"m": {"M": {"k": {"BOOL": True}}}}}) == 3 + (1 + (3 + 1 + 1 + 1) + 1)


def test_sets_count_their_elements() -> None:
    assert value_size({"SS": ["ab", "c"]}) == 3
    assert value_size({"NS": ["1", "22"]}) == 2 + 2


def test_a_write_costs_a_unit_per_started_kilobyte_and_one_at_least() -> None:
    assert [write_units(n) for n in (0, 1, 1024, 1025, 2048, 2049)] == [1, 1, 1, 2, 2, 3]


LIVE = Index(name="live", keys=("vpk", "vsk"), projection="KEYS_ONLY")
BY_TENANT = Index(name="by-tenant", keys=("lpk", "lsk"), projection="INCLUDE", included=("status",))
KEYS = ("pk", "sk")


def item(**attrs: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": "p"}, "sk": {"S": "s"}, **{k: {"S": v} for k, v in attrs.items()}}


def test_an_index_entry_costs_a_write_joining_or_leaving_and_nothing_left_as_it_was() -> None:
    out, live = item(status="done"), item(vpk="T#x#LIVE#STEP", vsk="run#1")
    assert LIVE.units(out, live, KEYS) == 1  # joins
    assert LIVE.units(live, out, KEYS) == 1  # leaves
    assert LIVE.units(live, None, KEYS) == 1  # the item deleted
    assert LIVE.units(live, {**live, "status": {"S": "running"}}, KEYS) == 0  # not projected: unchanged entry
    assert LIVE.units(out, {**out, "note": {"S": "x"}}, KEYS) == 0  # in no index before or after


def test_an_index_entry_moved_costs_both_and_a_projected_change_the_larger() -> None:
    before = item(lpk="T#x#RUNS", lsk="a", status="queued")
    assert BY_TENANT.units(before, {**before, "status": {"S": "running"}}, KEYS) == 1  # projected: rewritten
    assert BY_TENANT.units(before, {**before, "lsk": {"S": "b"}}, KEYS) == 2  # moved: out and in
    big = {**before, "status": {"S": "x" * 2000}}
    assert BY_TENANT.units(big, before, KEYS) == 2  # the larger of the two entries
    assert BY_TENANT.units(before, {**before, "other": {"S": "x" * 5000}}, KEYS) == 0  # not projected
