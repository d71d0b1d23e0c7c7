"""An attempt's declared secrets: read after its claim and before its model call, masked in
everything recorded from then on, handed to its programs, and let go when it ends.

- Every declared name must be found; one that is not fails the attempt before the model is
  called ("secret NAME is not set (declared by agent AGENT)"), the step's own fault, never
  retried.
- Each value is held by the store's redactor under the run's scope (`Redactor.hold`), as
  every value any agent of the run's flow declares already is (`usecases.masking`): every
  write through the store, the captures and the process's log records masks it as
  `[NAME]`. The step runner releases the scope when its attempts are done; with the last
  holder of the run in this process, the values are dropped. A run cannot end before its
  attempts do, so when a run ends no process still holds its values.
- `@NAME` values are written to 0600 files (`SecretFiles`) removed when the attempt ends.
- A name that is the model's, laneflow's or AWS's own crosses as `LANEFLOW_DECLARED_<NAME>`,
  and the trace says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laneflow.domain.errors import StepFailed
from laneflow.domain.records import EventType, Run
from laneflow.domain.secrets import crossing_note, declared_secrets, not_set, run_scope
from laneflow.domain.workspace import Agent
from laneflow.ports import ExecutionSink, SecretFileSet, Services
from laneflow.usecases.masking import values_loader


@dataclass
class AttemptSecrets:
    """What one attempt was given: the variables its programs get (`env`, for
    `StepJob.secret_env`) and the files to remove when it ends (`close`)."""

    env: dict[str, str] = field(default_factory=dict)
    files: SecretFileSet | None = None

    def close(self) -> None:
        """Remove the attempt's secret files (however it ended; idempotent)."""
        if self.files is not None:
            self.files.remove()
            self.files = None


def hold_run_secrets(svc: Services, run: Run) -> None:
    """A step of `run` starts working here: the run's values (every agent's of its flow, see
    `usecases.masking`) are masked from now until it is done (`release_run_secrets`), and
    longer while other work of the run holds them; so are its own, once loaded."""
    svc.redactor.hold(run_scope(run.tenant, run.id), values_loader(svc, run.tenant, run.id, lambda: run))


def release_run_secrets(svc: Services, run: Run) -> None:
    """This step is done with the run's secrets: with the run's last step here, they are
    dropped (see `Redactor.release`)."""
    svc.redactor.release(run_scope(run.tenant, run.id))


def load_secrets(svc: Services, run: Run, agent: Agent, sink: ExecutionSink) -> AttemptSecrets:
    """The agent's declared secrets for one attempt, masked under the run's scope (which the
    caller holds: `hold_run_secrets`). Raises `StepFailed` (not retryable) when one is not
    set, before anything of the model runs."""
    wanted = declared_secrets(agent.settings.secrets, agent=agent.name)
    if not wanted:
        return AttemptSecrets()
    if svc.secrets is None:
        raise StepFailed(
            f"secret {wanted[0].name} cannot be read: this deployment has no secret source (declared by agent {agent.name})",
            retryable=False,
        )
    values = svc.secrets.read(run.tenant, run.workspace_uri, [s.name for s in wanted])
    scope = run_scope(run.tenant, run.id)
    for name, value in values.items():  # masked before anything else, the failure below included
        svc.redactor.add(name, value, scope=scope)
    missing = [s.name for s in wanted if s.name not in values]
    if missing:
        raise StepFailed(not_set(missing[0], agent.name), retryable=False)
    loaded = AttemptSecrets()
    try:
        as_files = {s.name: values[s.name] for s in wanted if s.as_file}
        if as_files:
            if svc.secret_files is None:
                raise StepFailed("secrets given as files (@NAME) cannot be written here", retryable=False)
            loaded.files = svc.secret_files.write(as_files)
        for secret in wanted:
            loaded.env[secret.env_name] = (
                loaded.files.paths[secret.name] if secret.as_file and loaded.files else values[secret.name]
            )
            if secret.reserved_by:
                sink.event(EventType.info, crossing_note(secret), {"secret": secret.name, "as": secret.env_name})
        where = svc.secrets.where(run.workspace_uri)
        sink.event(
            EventType.info,
            f"secrets from {where}: {', '.join(s.env_name for s in wanted)}",
            {"secrets": [s.name for s in wanted]},
        )
    except BaseException:
        loaded.close()
        raise
    return loaded
