"""Run-wide masking: from the moment a run starts, every record of it is masked with every
value that any agent of its flow declares, and the model's key.

- The names are fixed as the run starts (`run.options["secrets"]`, names only: `secret_names`),
  so whoever works on the run later knows them without reading the workspace.
- The values are read where work of the run is done, through the deployment's `SecretSource`
  (locally `--secrets FILE`, the workspace's `.secrets.env` or the environment; in the cloud
  Secrets Manager under `laneflow/<tenant>/<NAME>`), and held by the store's redactor under the
  run's scope while that work lasts (`masking`): the store masks every write with them, the
  captures share the redactor, and so do the process's log records. They are never written.
- Who holds them: the start of a run (around its first write), every handler of the state
  machine (`entrypoints.lambda_handler`, in Lambda and on the embedded engine), a step's
  runner (a sandbox worker's too), a local drive for its whole length, and a person's answer.
  A value one step wrote into a file is therefore masked when any other step reads it.
- A name not set when the run starts is no error then: the step that declares it fails as it
  always did ("secret NAME is not set (declared by agent AGENT)"). A source that cannot be read
  refuses the start (nothing is written); later, it is a warning, and the step's own reading
  fails the step that needs it.
- With the last holder in a process, the values are dropped: when a run ends, nothing of it
  holds them any more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from laneflow.domain.errors import LaneflowError, RunNotFound
from laneflow.domain.records import Run
from laneflow.domain.secrets import declared_secrets, run_scope
from laneflow.domain.workspace import Agent
from laneflow.ports import Services

log = logging.getLogger("laneflow.secrets")

# The run's option that lists the declared names of every agent of its flow.
RUN_SECRETS = "secrets"


def secret_names(agents: Mapping[str, Agent]) -> list[str]:
    """Every name the flow's agents declare (each once, sorted): what the run is masked with.
    A name `laneflow check` refuses is left out (the step that declares it fails, saying so)."""
    names: set[str] = set()
    for agent in agents.values():
        try:
            names.update(secret.name for secret in declared_secrets(list(agent.settings.secrets), agent=agent.name))
        except LaneflowError:
            continue
    return sorted(names)


def run_values(svc: Services, run: Run) -> dict[str, str]:
    """The values `run` is masked with (name -> value): the model's key where this process
    holds it already (it is read only where a step runs, which reads it before it records
    anything), and every name of `run.options["secrets"]` that is set."""
    values = dict(svc.held_secret_values())
    names = [str(name) for name in run.options.get(RUN_SECRETS) or []]
    if names and svc.secrets is not None:
        values.update(svc.secrets.read(run.tenant, run.workspace_uri, names))
    return values


def masking(svc: Services, run: Run, *, strict: bool = False) -> AbstractContextManager[None]:
    """Hold `run`'s values in the store's redactor while the block runs (loaded by the first
    holder in this process, dropped with the last). `strict`: a source that cannot be read
    raises (a run about to be written is refused); else it is logged, naming the error's
    type only, and the block runs masked with what this process has."""
    return _held(svc, run.tenant, run.id, lambda: run, strict=strict)


def masking_of(svc: Services, tenant: str, run_id: str) -> AbstractContextManager[None]:
    """`masking` for a run known by its id (a handler's event): the run is read only when its
    values are not held here already. A run that does not exist is masked with what this
    process has (the work itself meets the same error)."""
    return _held(svc, tenant, run_id, lambda: svc.store.get_run(tenant, run_id, detail=False, steps=False, input=False))


def values_loader(
    svc: Services, tenant: str, run_id: str, read_run: Callable[[], Run], *, strict: bool = False
) -> Callable[[], dict[str, str]]:
    """What reads a run's values for `Redactor.hold` (see `masking` for `strict`)."""

    def load() -> dict[str, str]:
        try:
            return run_values(svc, read_run())
        except RunNotFound:
            return {}
        except Exception as error:
            if strict:
                raise
            log.warning("secrets of run %s could not be read for masking: %s", run_id, type(error).__name__)
            return {}

    return load


@contextmanager
def _held(svc: Services, tenant: str, run_id: str, read_run: Callable[[], Run], *, strict: bool = False) -> Iterator[None]:
    scope = run_scope(tenant, run_id)
    try:
        svc.redactor.hold(scope, values_loader(svc, tenant, run_id, read_run, strict=strict))
        yield
    finally:
        svc.redactor.release(scope)
