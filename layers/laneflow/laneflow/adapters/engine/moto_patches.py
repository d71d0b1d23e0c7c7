"""What the embedded engine changes in moto's Step Functions interpreter besides its Lambda
call, each a narrow, idempotent replacement of one moto internal (moto is pinned exactly;
tests/unit/test_engine_patch.py fails loudly if any of them moves):

- **Which execution a Lambda call serves.** moto's Lambda integration
  (`lambda_eval_utils.execute_lambda_function_integration`) knows the state's environment,
  and with it the execution; the function the engine replaces
  (`_invoke_lambda_function`) does not. The integration is wrapped so the execution's ARN is
  noted on the calling thread for the duration of the call (`current_execution`): the engine
  then answers with the handlers and services of the drive that execution belongs to, so
  drives run at once.
- **JSONPath parses are memoized.** moto parses a path with jsonpath-ng on every evaluation
  (`json_path.extract_json`, `ResultPath._eval_body`), about 1 ms of ply parsing each; a
  definition holds a few dozen distinct paths, so each is parsed once per process. A parsed
  path is not changed by `find` or `update_or_create`, so threads share it.
- **A plain path is walked, not searched.** Even parsed once, jsonpath-ng's `find` wraps
  every value it passes in context objects; the definition's paths are almost all plain
  (`$`, `$.run`, `$.plan.lanes`: names joined by dots, as jsonpath-ng parses them), and
  `extract_json` of one is the value reached by walking its names through dicts. Those are walked directly (`_walked`);
  any other path, or a walk that meets anything but a dict, goes to moto's own, which also
  raises its error for a name that is not there. Every module that imported `extract_json`
  by name gets the walked one.
- **A definition is parsed once per process, not once per execution.** moto parses a
  definition into evaluation components (`AmazonStateLanguageParser.parse`: ANTLR, then a
  preprocessor) when the state machine is created (to validate it) and again for every
  execution it starts: 310-330 ms of CPU for laneflow's 44 KB definition each time, paid by
  every drive and every segment (a later drive of one stub step took 350-500 ms with it,
  43 ms without). The parse is kept by definition text (`PROGRAMS_KEPT`) and shared. The
  components are built once and only read while they evaluate: moto already evaluates one
  tree from many threads at once (every iteration of a Map runs its item processor's
  components), and what an evaluation changes lives in its environment. The one value a
  component makes for itself, lazily, its heap key, is made for every component as it is
  parsed, so no two threads race to make it. A definition that does not parse raises as
  before and is not kept.
- **Finished executions are forgotten** (`forget`): moto keeps every execution (its history,
  its environment) and every worker thread it ever started (`utils.TMP_THREADS`, a list
  nothing reads), so a long-lived process (`laneflow serve`) grew by ~24 KiB a step forever.
  It also keeps every model object it ever made, for its dashboard (`instances_tracked`, a
  list on each model class, appended to by `BaseModel.__new__`): each execution's snapshot of
  its state machine (a deep copy) was one more, kept after the execution was forgotten.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from typing import Any

# Distinct JSONPath expressions kept parsed: a definition has a few dozen; the bound only
# stops a definition that builds paths from data from growing the cache without end.
PARSE_CACHE_SIZE = 1024

# Where the objects of a parsed program are defined (what the heap-key walk goes into).
ASL_MODULES = "moto.stepfunctions.parser.asl."

# Distinct definitions kept parsed (the engine has one; tests make a few).
PROGRAMS_KEPT = 16

_lock = threading.Lock()

_untracking = threading.Lock()

_installed = False

_calling = threading.local()


def current_execution() -> str | None:
    """The ARN of the execution whose Lambda integration runs on this thread, if any."""
    arn: str | None = getattr(_calling, "execution", None)
    return arn


def execution_of(env: Any) -> str | None:
    """The ARN of the execution a state's environment belongs to (`$$.Execution.Id`): for
    any other integration the engine answers in-process, to find the drive it serves."""
    execution = env.states.context_object.context_object_data.get("Execution") or {}
    arn = execution.get("Id")
    return str(arn) if arn else None


def _noting_execution(integration: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(integration)
    def integrate(env: Any, parameters: dict[str, Any], region: str, state_credentials: Any) -> None:
        before = getattr(_calling, "execution", None)
        _calling.execution = execution_of(env)
        try:
            integration(env, parameters, region, state_credentials)
        finally:
            _calling.execution = before

    integrate.__laneflow_patch__ = True  # type: ignore[attr-defined]
    return integrate


def _memoized(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    cached = functools.lru_cache(maxsize=PARSE_CACHE_SIZE)(parse)
    cached.__laneflow_patch__ = True  # type: ignore[attr-defined]
    return cached


# The modules of moto's interpreter that call `extract_json` (by name, or through json_path).
EXTRACT_JSON_USERS = (
    "moto.stepfunctions.parser.asl.utils.json_path",
    "moto.stepfunctions.parser.asl.eval.states",
    "moto.stepfunctions.parser.asl.component.common.string.string_expression",
    "moto.stepfunctions.parser.asl.component.intrinsic.argument.argument",
    "moto.stepfunctions.parser.asl.component.state.choice.comparison.operator.implementations.timestamp_operators",
    "moto.stepfunctions.parser.asl.component.state.choice.comparison.operator.implementations.boolean_equals",
    "moto.stepfunctions.parser.asl.component.state.choice.comparison.operator.implementations.numeric",
    "moto.stepfunctions.parser.asl.component.state.choice.comparison.operator.implementations.string_operators",
)


def _plain_names(parsed: Any) -> tuple[str, ...] | None:
    """The names of a parsed path that is `$` followed by plain field names, else None."""
    from jsonpath_ng import jsonpath

    names: list[str] = []
    while type(parsed) is jsonpath.Child:
        field = parsed.right
        if type(field) is not jsonpath.Fields or len(field.fields) != 1 or field.fields[0] in ("*", jsonpath.auto_id_field):
            return None
        names.append(field.fields[0])
        parsed = parsed.left
    return tuple(reversed(names)) if type(parsed) is jsonpath.Root else None


def _walked(extract_json: Callable[[str, Any], Any], parse: Callable[[str], Any]) -> Callable[[str, Any], Any]:
    @functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
    def names_of(path: str) -> tuple[str, ...] | None:
        return _plain_names(parse(path))  # what jsonpath-ng itself parsed decides

    @functools.wraps(extract_json)
    def walk(path: str, data: Any) -> Any:
        try:
            names = names_of(path)
        except Exception:  # a path jsonpath-ng cannot parse: moto's own raises it
            names = None
        if names is None:
            return extract_json(path, data)
        value = data
        for name in names:
            if type(value) is not dict or name not in value:  # moto's own says what is wrong
                return extract_json(path, data)
            value = value[name]
        return value

    walk.__laneflow_patch__ = True  # type: ignore[attr-defined]
    return walk


def _with_heap_keys(program: Any) -> Any:
    """Make the heap key of every evaluation component of a parsed program (a walk of its
    attributes, through moto's own objects), so threads sharing it only ever read them."""
    from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent

    seen: set[int] = set()
    todo: list[Any] = [program]
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, EvalComponent):
            _ = value.heap_key
        if type(value).__module__.startswith(ASL_MODULES) and hasattr(value, "__dict__"):
            todo.extend(vars(value).values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            todo.extend(value)
        elif isinstance(value, dict):
            todo.extend(value.values())
    return program


def _parsed_once(parse: Callable[[str], Any]) -> Any:
    @functools.lru_cache(maxsize=PROGRAMS_KEPT)
    def parse_once(definition: str) -> tuple[Any, Any]:
        program, tree = parse(definition)
        return _with_heap_keys(program), tree

    parse_once.__laneflow_patch__ = True  # type: ignore[attr-defined]
    return staticmethod(parse_once)  # as moto's own is: called on the class


def _require(module: Any, name: str) -> Any:
    if not hasattr(module, name):  # pragma: no cover - guarded by tests/unit/test_engine_patch.py
        raise RuntimeError(f"moto's Step Functions interpreter changed: {module.__name__}.{name} is gone")
    return getattr(module, name)


def _replace(module: Any, name: str, wrap: Callable[[Any], Any]) -> None:
    current = _require(module, name)
    if not getattr(current, "__laneflow_patch__", False):
        setattr(module, name, wrap(current))


def install() -> None:
    """Make the replacements above (idempotent, thread-safe)."""
    global _installed
    with _lock:
        if _installed:
            return
        from moto.stepfunctions.parser.asl.component.common.path import result_path
        from moto.stepfunctions.parser.asl.component.state.exec.state_task import (
            lambda_eval_utils,
        )
        from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
        from moto.stepfunctions.parser.asl.utils import json_path

        _replace(lambda_eval_utils, "execute_lambda_function_integration", _noting_execution)
        _replace(AmazonStateLanguageParser, "parse", _parsed_once)
        _replace(json_path, "parse", _memoized)
        _replace(result_path, "parse", _memoized)
        extract_json = _require(json_path, "extract_json")
        walked = (
            extract_json
            if getattr(extract_json, "__laneflow_patch__", False)
            else _walked(extract_json, _require(json_path, "parse"))
        )
        for name in EXTRACT_JSON_USERS:
            module = importlib.import_module(name)
            if not getattr(_require(module, "extract_json"), "__laneflow_patch__", False):
                setattr(module, "extract_json", walked)  # noqa: B010 - a module moto types as having none
        _installed = True


def forget(backend: Any, execution_arn: str) -> None:
    """Drop a finished execution from moto's backend, and the worker threads of moto's that
    have ended, so nothing of it stays in the process. A running execution is kept."""
    from moto.stepfunctions.parser import utils

    for machine in list(backend.state_machines):
        executions = machine.executions
        for execution in list(executions):
            if execution.execution_arn == execution_arn and execution.status != "RUNNING":
                executions.remove(execution)
                _untrack(getattr(execution, "state_machine", None))
    # Rebuilt in place (the interpreter's modules hold this very list). A thread appended
    # while it is rebuilt may be left out: nothing reads the list, so that only frees it.
    threads = utils.TMP_THREADS
    threads[:] = [thread for thread in threads if thread.is_alive()]


def _untrack(model: Any) -> None:
    """Drop one model object from moto's dashboard list of its class, by identity. moto only
    appends to the list (at its end), so under the lock an index found stays right."""
    tracked = getattr(type(model), "instances_tracked", None)
    if model is None or tracked is None:
        return
    with _untracking:
        for at in range(len(tracked) - 1, -1, -1):
            if tracked[at] is model:
                del tracked[at]
                return
