"""moto's Step Functions interpreter without its AWS Batch model, until a definition names Batch.

moto's factory of service integrations (`state_task_service_factory`) imports every
integration when it is imported, and its Batch one imports `moto.batch.utils` for one enum;
importing that package imports moto's whole Batch model, and with it its EC2, ECS, IAM and
CloudWatch Logs models: EC2 alone reads every region's instance types and zones through
botocore. That was 0.65-0.7 s of CPU of every process that starts the embedded engine
(`laneflow run` of one stub step took 3.5 s of CPU), for an integration laneflow's definition
never uses (its Task states call Lambda and, for a sandboxed step, ECS, whose integration
imports no model).

`install`, called before moto's interpreter is first imported, puts a stand-in for that one
module in `sys.modules`: the factory finds its `StateTaskServiceBatch`, a class whose
construction (the factory's answer for a `batch:` resource, made when a definition naming it
is parsed) imports moto's own module and returns moto's own integration. Nothing else in
the process is changed, and a process that imported the interpreter already keeps it as
it is. moto is pinned exactly; tests/unit/test_engine_lazy.py fails if the factory stops
importing the integration from that module or the stand-in stops keeping EC2 out.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

SERVICES = "moto.stepfunctions.parser.asl.component.state.exec.state_task.service"

BATCH = f"{SERVICES}.state_task_service_batch"

FACTORY = f"{SERVICES}.state_task_service_factory"

_lock = threading.Lock()


class _StandIn(types.ModuleType):
    """What `sys.modules` holds for moto's Batch integration until it is first needed."""


def real_batch() -> types.ModuleType:
    """moto's own Batch integration module, imported now if it was not (the stand-in leaves)."""
    with _lock:
        if isinstance(sys.modules.get(BATCH), _StandIn):
            del sys.modules[BATCH]
        return importlib.import_module(BATCH)


class StateTaskServiceBatch:
    """Stands for moto's class: making one makes moto's own (its module imported first)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return real_batch().StateTaskServiceBatch(*args, **kwargs)


def install() -> bool:
    """Put the stand-in in place (True), unless moto's factory or its Batch integration is
    imported already (False: nothing is changed). Idempotent, cheap to call again."""
    if BATCH in sys.modules or FACTORY in sys.modules:
        return isinstance(sys.modules.get(BATCH), _StandIn)
    with _lock:
        if BATCH in sys.modules or FACTORY in sys.modules:
            return isinstance(sys.modules.get(BATCH), _StandIn)
        stand_in = _StandIn(BATCH, "laneflow's stand-in for moto's Batch integration (laneflow.adapters.engine.moto_lazy)")
        stand_in.StateTaskServiceBatch = StateTaskServiceBatch  # type: ignore[attr-defined]
        sys.modules[BATCH] = stand_in
        return True
