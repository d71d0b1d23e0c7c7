"""The DynamoDB store's values as AttributeValues: boto3's serializer and deserializer, with
the numbers and shapes the store has always kept (an item written before reads the same)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from laneflow.adapters.store.dynamodb_items import encode, from_av, to_attr, to_av


def test_an_item_keeps_the_attribute_values_it_always_kept() -> None:
    item = encode({"pk": "T#t#R#r", "n": 3, "cost_usd": to_attr("cost_usd", 0.1 + 0.2), "ok": True, "gone": None})
    assert item == {"pk": {"S": "T#t#R#r"}, "n": {"N": "3"}, "cost_usd": {"N": "0.3"}, "ok": {"BOOL": True}}
    assert to_av({"t": "tok", "n": 2}) == {"M": {"t": {"S": "tok"}, "n": {"N": "2"}}}
    assert to_av(to_attr("ratio", 0.25)) == {"N": "0.25"}  # a float field is kept as its Decimal


def test_a_float_is_refused_as_it_comes_a_field_s_float_goes_through_to_attr() -> None:
    with pytest.raises(TypeError):
        to_av(0.5)


@pytest.mark.parametrize(
    ("av", "value"),
    [
        ({"N": "7"}, 7),
        ({"N": "-2"}, -2),
        ({"N": "0.3"}, 0.3),
        ({"S": "x"}, "x"),
        ({"BOOL": False}, False),
        ({"NULL": True}, None),
    ],
)
def test_a_stored_value_reads_as_the_model_reads_it(av: Any, value: Any) -> None:
    got = from_av(av)
    assert got == value and type(got) is type(value)
    assert not isinstance(from_av({"N": "1.5"}), Decimal)
