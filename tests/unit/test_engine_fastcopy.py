"""The engine's faster deep copy for moto's interpreter (adapters/engine/moto_fastcopy.py): it
gives what `copy.deepcopy` gives, and it is installed where moto copies. If moto stops
copying through the `copy` module in one of those modules, these fail loudly."""

from __future__ import annotations

import copy
import datetime
import importlib
import inspect
from collections import OrderedDict
from typing import Any

import pytest

from laneflow.adapters.engine import local, moto_fastcopy
from laneflow.adapters.engine.moto_fastcopy import json_deepcopy


def test_every_module_patched_copies_through_copy_deepcopy_and_gets_the_stand_in() -> None:
    local.install_interpreter_hook()
    for name in moto_fastcopy.MODULES:
        module = importlib.import_module(name)
        assert "copy.deepcopy(" in inspect.getsource(module), name
        assert module.copy is moto_fastcopy._COPY and module.copy.deepcopy is json_deepcopy, name
    # the stand-in is the copy module in all else
    assert moto_fastcopy._COPY.copy is copy.copy and moto_fastcopy._COPY.Error is copy.Error
    assert copy.deepcopy is not json_deepcopy  # nothing outside those modules is changed


def test_install_is_idempotent() -> None:
    moto_fastcopy.install()
    moto_fastcopy.install()
    states = importlib.import_module("moto.stepfunctions.parser.asl.eval.states")
    assert states.copy is moto_fastcopy._COPY


JSON_VALUES = [
    None,
    True,
    0,
    -3,
    2.5,
    "",
    "text",
    [],
    {},
    [1, [2, [3, {"a": None}]]],
    {
        "tenant": "local",
        "run_id": "r-1",
        "plan": {"lanes": [{"index": i, "role": "lead" if i == 0 else "sibling"} for i in range(5)]},
    },
    {"1": [True, False, None], "nested": {"deep": {"deeper": ["x", 1.0e-3, -0.0]}}},
]


@pytest.mark.parametrize("value", JSON_VALUES)
def test_a_json_value_is_copied_as_deepcopy_copies_it(value: Any) -> None:
    copied = json_deepcopy(value)
    assert copied == copy.deepcopy(value) and type(copied) is type(value)
    if isinstance(value, (dict, list)):
        assert copied is not value


def test_the_copy_is_independent_of_the_original() -> None:
    value = {"a": [1, {"b": [2]}], "c": {"d": "e"}}
    copied = json_deepcopy(value)
    copied["a"][1]["b"].append(3)
    copied["c"]["d"] = "changed"
    assert value == {"a": [1, {"b": [2]}], "c": {"d": "e"}}


def test_shared_parts_stay_shared_and_a_cycle_stays_a_cycle_as_with_deepcopy() -> None:
    shared = {"x": [1, 2]}
    value = {"one": shared, "two": shared, "list": [shared["x"], shared["x"]]}
    copied = json_deepcopy(value)
    assert copied["one"] is copied["two"] and copied["one"] is not shared
    assert copied["list"][0] is copied["list"][1] is copied["one"]["x"]
    loop: list[Any] = [1]
    loop.append(loop)
    looped = json_deepcopy(loop)
    assert looped[1] is looped and looped is not loop


class Thing:
    def __init__(self, payload: Any) -> None:
        self.payload = payload


def test_anything_but_json_is_copied_by_deepcopy_itself_with_the_same_memo() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    inner = {"k": [1]}
    value: dict[str, Any] = {
        "when": when,
        "tuple": (1, [2]),
        "set": {1, 2},
        "ordered": OrderedDict(a=1),
        "thing": Thing(inner),
        "again": inner,
    }
    copied = json_deepcopy(value)
    assert copied["when"] == when and copied["tuple"] == (1, [2]) and copied["tuple"][1] is not value["tuple"][1]
    assert copied["set"] == {1, 2} and copied["set"] is not value["set"]
    assert type(copied["ordered"]) is OrderedDict and copied["ordered"] == value["ordered"]
    assert isinstance(copied["thing"], Thing) and copied["thing"] is not value["thing"]
    assert copied["thing"].payload is copied["again"] and copied["again"] is not inner  # one memo throughout


def test_a_memo_given_by_a_caller_is_used_as_deepcopy_uses_it() -> None:
    shared = [1]
    memo: dict[int, Any] = {}
    first = json_deepcopy({"a": shared}, memo)
    second = copy.deepcopy({"b": shared}, memo)
    assert first["a"] is second["b"]


def test_a_maps_closed_jobs_are_copied_as_deepcopy_copies_them_and_stay_independent() -> None:
    """A Map's end copies its closed jobs whole (a set of moto's JobClosed records): the
    fast copy makes new records whose outputs are deep copies, as `copy.deepcopy` does."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.job import JobClosed

    moto_fastcopy.install()
    assert JobClosed in moto_fastcopy._RECORDS
    shared = {"run": {"tenant": "local", "run_id": "r-1"}}
    jobs = {JobClosed(job_index=i, job_output={"step": {"index": i}, "ctx": shared}) for i in range(50)}
    fast, slow = json_deepcopy(jobs), copy.deepcopy(jobs)
    assert type(fast) is set and len(fast) == 50
    view = lambda js: sorted((j.job_index, j.job_output) for j in js)  # noqa: E731
    assert view(fast) == view(slow)  # type: ignore[no-untyped-call]
    assert all(type(j) is JobClosed for j in fast) and not {id(j) for j in fast} & {id(j) for j in jobs}
    one = next(iter(fast))
    one.job_output["step"]["index"] = -1
    one.job_output["ctx"]["run"]["tenant"] = "changed"
    assert shared == {"run": {"tenant": "local", "run_id": "r-1"}}

    # within one copy a value met twice stays shared, as copy.deepcopy keeps it
    def ctx_of(job: JobClosed) -> int:
        assert job.job_output is not None
        return id(job.job_output["ctx"])

    assert len({ctx_of(j) for j in fast}) == 1 == len({ctx_of(j) for j in slow})


def test_only_plain_records_are_taken_for_the_fast_copy() -> None:
    class Custom:
        def __deepcopy__(self, memo: Any) -> str:
            return "custom"

    class Slotted:
        __slots__ = ("a",)

    class Plain:
        def __init__(self) -> None:
            self.a = [1]

    assert not moto_fastcopy._plain(Custom) and not moto_fastcopy._plain(Slotted) and moto_fastcopy._plain(Plain)
    assert not moto_fastcopy._plain(OrderedDict)
