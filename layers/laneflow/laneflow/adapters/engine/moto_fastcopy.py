"""A faster `copy.deepcopy` for the JSON values moto's Step Functions interpreter copies.

moto's interpreter deep-copies a state's input, output and stack for every state, Map
iteration, Parallel branch and Task frame (`States._extract`, `States.reset`,
`Environment.as_frame_of`, `ExecuteState`'s frame, `ResultPath`, ...), through the generic
`copy.deepcopy`, which dispatches, memoizes and keeps alive every value it meets. Those
values are almost always JSON (dicts, lists, text, numbers, booleans, null): `json_deepcopy`
copies those directly, the way `copy.deepcopy` would (the same memo, so a dict or list met
twice is copied once and shared, and a cycle stays a cycle), and hands anything else
(a subclass of dict, a tuple, a set, a datetime, moto's own objects) to `copy.deepcopy`
itself, with the same memo. Sets and moto's few plain records it copies in bulk (`RECORDS`)
it copies as `copy.deepcopy` does, their contents this way. Its result is always what
`copy.deepcopy` gives.

`install` points the `copy` name of each module listed in `MODULES` at a stand-in whose
`deepcopy` is `json_deepcopy` (every other attribute is the `copy` module's); nothing else
in the process is changed. Idempotent; moto is pinned exactly, and
tests/unit/test_engine_fastcopy.py fails if one of these modules stops copying through
`copy.deepcopy`.
"""

from __future__ import annotations

import copy
import importlib
import types
from typing import Any

# moto's interpreter modules whose `copy.deepcopy` copies the values a state carries.
MODULES = (
    "moto.stepfunctions.parser.asl.eval.states",
    "moto.stepfunctions.parser.asl.eval.environment",
    "moto.stepfunctions.parser.asl.eval.event.event_manager",
    "moto.stepfunctions.parser.asl.component.state.exec.execute_state",
    "moto.stepfunctions.parser.asl.component.state.exec.state_map.state_map",
    "moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.job",
    "moto.stepfunctions.parser.asl.component.state.exec.state_parallel.state_parallel",
    "moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service",
    "moto.stepfunctions.parser.asl.component.common.path.result_path",
    "moto.stepfunctions.parser.asl.component.common.string.string_expression",
    "moto.stepfunctions.parser.asl.component.intrinsic.function.statesfunction.json_manipulation.json_merge",
)

_ATOMIC = frozenset({str, int, float, bool, type(None)})


def json_deepcopy(value: Any, memo: dict[int, Any] | None = None, _nil: Any = None) -> Any:
    """`copy.deepcopy(value, memo)`, faster for JSON values (see the module docstring)."""
    if type(value) in _ATOMIC:
        return value
    if memo is None:  # a memo of its own, dropped after: nothing need be kept alive for it
        return _copy(value, {}, None)
    # A caller's memo may be used again after this copy: like `copy.deepcopy`, keep what it
    # copied alive in it, so no id it names is reused by another object meanwhile.
    alive = memo.setdefault(id(memo), [])
    return _copy(value, memo, alive)


def _copy(value: Any, memo: dict[int, Any], alive: list[Any] | None) -> Any:
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind in _RECORDS or kind is set:
        return _copy_record(value, memo, alive)
    if kind is not dict and kind is not list:
        return copy.deepcopy(value, memo)
    done = memo.get(id(value))
    if done is not None:
        return done
    if alive is not None:
        alive.append(value)
    if kind is dict:
        out: dict[Any, Any] = {}
        memo[id(value)] = out
        for key, item in value.items():
            out[key if type(key) in _ATOMIC else copy.deepcopy(key, memo)] = _copy(item, memo, alive)
        return out
    items: list[Any] = []
    memo[id(value)] = items
    for item in value:
        items.append(_copy(item, memo, alive))
    return items


def _copy_record(value: Any, memo: dict[int, Any], alive: list[Any] | None) -> Any:
    """A set, or one of moto's plain records (`RECORDS`), as `copy.deepcopy` copies it
    (through `__reduce_ex__`: a new object whose `__dict__` is a deep copy, a set of deep
    copies), its contents through this copy."""
    done = memo.get(id(value))
    if done is not None:
        return done
    if alive is not None:
        alive.append(value)
    if type(value) is set:
        out: Any = {_copy(item, memo, alive) for item in value}
        memo[id(value)] = out
        return out
    out = object.__new__(type(value))
    memo[id(value)] = out
    if value.__dict__:
        out.__dict__.update(_copy(value.__dict__, memo, alive))
    return out


# moto's plain records the interpreter deep-copies in bulk: a Map's closed jobs, one per
# iteration, copied whole when the Map ends (`JobPool.get_closed_jobs`). Plain: no slots, no
# `__deepcopy__`, `__reduce_ex__`, `__getstate__` or `__setstate__` of their own (`install` checks).
RECORDS = ("moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.job.JobClosed",)

_RECORDS: set[type] = set()


def _plain(kind: type) -> bool:
    own = ("__deepcopy__", "__reduce_ex__", "__reduce__", "__getstate__", "__setstate__", "__slots__", "__new__")
    return not any(name in vars(k) for k in kind.__mro__[:-1] for name in own) and kind.__mro__[-1] is object


def _stand_in() -> types.ModuleType:
    """A `copy` module whose `deepcopy` is `json_deepcopy`."""
    shim = types.ModuleType("copy", "copy, with deepcopy fast for JSON values (laneflow's engine)")
    shim.__dict__.update({k: v for k, v in vars(copy).items() if not k.startswith("__")})
    shim.deepcopy = json_deepcopy  # type: ignore[attr-defined]
    shim.__laneflow_patch__ = True  # type: ignore[attr-defined]
    return shim


_COPY = _stand_in()


def install() -> None:
    """Point each of `MODULES`' `copy` at the stand-in (idempotent)."""
    for name in MODULES:
        module = importlib.import_module(name)
        current = getattr(module, "copy", None)
        if current is _COPY:
            continue
        if current is not copy:  # pragma: no cover - guarded by tests/unit/test_engine_fastcopy.py
            raise RuntimeError(f"moto's Step Functions interpreter changed: {name} no longer copies through the copy module")
        module.copy = _COPY  # type: ignore[attr-defined]
    for path in RECORDS:
        module_name, _, name = path.rpartition(".")
        kind = getattr(importlib.import_module(module_name), name)
        if not _plain(kind):  # pragma: no cover - guarded by tests/unit/test_engine_fastcopy.py
            raise RuntimeError(f"moto's Step Functions interpreter changed: {path} is no longer a plain record")
        _RECORDS.add(kind)
