"""Who works on an attempt or drives a run: a worker reference, one model per kind.

An attempt keeps the worker that runs it (`Attempt.worker`), a run the worker that drives it
(`Run.driver`). Reconcile asks whether that worker is still there (`WorkerLiveness`):
- `LocalProcess`: a process on a host (its start time guards against a reused pid);
- `LambdaRequest`: one Lambda invocation, gone once past its deadline;
- `StepFunctionsExecution`: a drive in the cloud, gone once the execution is not running;
- `FargateTask`: an ECS task, gone once it stopped.

Stores keep a reference as the JSON text of its fields, keys sorted (`dumps`), which is
byte for byte what they kept before references were models; `loads` reads it back, and a
text that names no known worker reads as None (nothing to ask about).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class _Worker(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def same(self, other: WorkerRef | None) -> bool:
        """Whether `other` names the same worker (the same process, request, execution or
        task), whatever else it says (a Lambda's deadline is computed anew on every call)."""
        return type(other) is type(self) and self._identity() == other._identity()

    def _identity(self) -> tuple[Any, ...]:
        raise NotImplementedError


# The variable a step worker of the embedded engine is given: the engine's process (a
# LocalProcess as JSON), whose attempts it runs and with which it ends.
ENGINE_WORKER = "LANEFLOW_ENGINE_WORKER"


class LocalProcess(_Worker):
    kind: Literal["local"] = "local"
    host: str
    pid: int
    started: str | None = None  # the kernel's start time of the process (clock ticks since boot)

    def _identity(self) -> tuple[Any, ...]:
        return (self.host, self.pid, self.started)


class LambdaRequest(_Worker):
    kind: Literal["lambda"] = "lambda"
    request_id: str
    deadline: float  # epoch seconds: when the invocation times out

    def _identity(self) -> tuple[Any, ...]:
        return (self.request_id,)


class StepFunctionsExecution(_Worker):
    kind: Literal["sfn"] = "sfn"
    execution: str | None = None  # the execution's ARN (None: started without one)

    def _identity(self) -> tuple[Any, ...]:
        return (self.execution,)


class FargateTask(_Worker):
    kind: Literal["fargate"] = "fargate"
    task: str  # the task's ARN
    cluster: str | None = None

    def _identity(self) -> tuple[Any, ...]:
        return (self.task,)


WorkerRef = Annotated[LocalProcess | LambdaRequest | StepFunctionsExecution | FargateTask, Field(discriminator="kind")]

# Only field names are kept in pydantic-core's string cache (records.READ_JSON says why).
_WORKER: TypeAdapter[WorkerRef] = TypeAdapter(WorkerRef, config=ConfigDict(cache_strings="keys"))


def dumps(worker: WorkerRef) -> str:
    """The text a store keeps for a reference."""
    return json.dumps(worker.model_dump(mode="json"), sort_keys=True)


def loads(text: str | None) -> WorkerRef | None:
    """A reference from the text a store keeps; None when there is none, or when the text
    names no worker of a known kind (a hand edit, a kind this version does not know)."""
    if not text:
        return None
    try:
        return _WORKER.validate_json(text)
    except ValidationError:
        return None


def stored(value: Any) -> Any:
    """A record's worker field as validated: its stored text is read with `loads`, anything
    else (a reference, its fields, None) is validated as it is."""
    return loads(value) if isinstance(value, str) else value
