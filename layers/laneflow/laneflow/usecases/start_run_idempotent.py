"""Starting a run for a request that may come again (the HTTP API's start).

With an `idempotency_key`, the run id is derived from (tenant, key), so a repeated start
finds the run it made instead of making another, and starts no second drive. The request
it was made from is kept as a fingerprint on the run: the same key with a different
request is a conflict (`IdempotencyKeyReused`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from laneflow.domain.errors import Conflict, IdempotencyKeyReused, RunNotFound, Unavailable
from laneflow.domain.records import Run
from laneflow.ports import Services
from laneflow.usecases.masking import masking
from laneflow.usecases.start_run import prepare_run

IDEMPOTENT_PREFIX = "run-k-"


class RunOfAFlow(BaseModel):
    """A run of a flow of a workspace on an input: what a start (`StartRun`) and an estimate
    (`usecases.estimate.EstimateRequest`) are asked about."""

    model_config = ConfigDict(extra="forbid")

    workspace: str = Field(min_length=1, max_length=200, description="the workspace's name")
    flow: str = Field(min_length=1, max_length=200, description="the flow's name (flows/<flow>.yaml)")
    input: dict[str, Any] = Field(default_factory=dict, description="the run's input, checked against the flow's `input:` schema")
    model: str | None = Field(default=None, min_length=1, max_length=200, description="run every step on this model")


class StartRun(RunOfAFlow):
    """Start a run of a flow of a workspace on an input."""

    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="the same key again returns the run it started (200) and starts nothing",
    )

    def fingerprint(self) -> str:
        """What the request asks for (everything but the key), to tell a retry from a reuse."""
        asked = self.model_dump(mode="json", exclude={"idempotency_key"})
        return "sha256:" + hashlib.sha256(json.dumps(asked, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Started:
    """The run a start answers with: made and driven now, or (`replayed`) the one its
    idempotency key started before, with nothing new started."""

    run: Run
    replayed: bool = False


def idempotent_run_id(tenant: str, key: str) -> str:
    """The run id a (tenant, idempotency key) pair names; one tenant's key never names another's run."""
    return IDEMPOTENT_PREFIX + hashlib.sha256(f"{tenant}\n{key}".encode()).hexdigest()[:24]


def start_run_idempotent(svc: Services, tenant: str, request: StartRun) -> Started:
    """Make the run the request asks for, in the tenant's own workspace, and start its
    first drive; or, for an idempotency key seen before, answer the run it started.

    Raises `Unavailable` when this deployment cannot start drives or has no workspaces,
    `IdempotencyKeyReused` for a key seen with a different request, and what making the
    run raises (an unknown workspace or flow, an input that does not fit)."""
    if svc.drives is None:
        raise Unavailable("this deployment cannot start drives")
    if svc.workspaces is None:
        raise Unavailable("this deployment has no workspaces to start runs from")
    workspaces = svc.workspaces
    # The caller's own workspace, never another tenant's.
    return start_in(svc, tenant, request, lambda: workspaces.locate(tenant, request.workspace))


def start_in(
    svc: Services,
    tenant: str,
    request: StartRun,
    where: Callable[[], str],
    *,
    account: str | None = None,
    options: dict[str, Any] | None = None,
) -> Started:
    """`start_run_idempotent` in the tenant's workspace that `where()` finds (asked only when a
    run is to be made): make the run (or, for a key seen before, answer the one it made) and
    start its drive where this deployment can (`svc.drives`); where it cannot, the run is left
    `queued`, and whoever drives runs here (`laneflow run`, reconcile's re-drive of queued
    runs) drives it."""
    run_id = idempotent_run_id(tenant, request.idempotency_key) if request.idempotency_key else None
    if run_id and (earlier := _earlier(svc, tenant, run_id, request)):
        return Started(earlier, replayed=True)
    uri = where()
    run = prepare_run(
        svc,
        svc.folders.open(uri),
        request.flow,
        request.input,
        tenant=tenant,
        model=request.model,
        account=account,
        options=options,
    )
    run.workspace_uri = uri  # where every later reader finds it (an S3 URI in the cloud)
    if run_id:
        run.id = run_id
        run.options["idempotency_request"] = request.fingerprint()
    try:
        with masking(svc, run, strict=True):  # its input, instructions and flow are masked as they are first written
            svc.store.create_run(run)
    except Conflict:
        # The same key, at the same moment, from a second request: it made the run.
        if run_id and (earlier := _earlier(svc, tenant, run_id, request)):
            return Started(earlier, replayed=True)
        raise
    if svc.drives is not None:
        svc.drives.start(tenant, run.id)
    return Started(run)


def _earlier(svc: Services, tenant: str, run_id: str, request: StartRun) -> Run | None:
    """The run an idempotency key already started, or None if it started none."""
    try:
        run = svc.store.get_run(tenant, run_id, detail=False)
    except RunNotFound:
        return None
    if run.options.get("idempotency_request") != request.fingerprint():
        raise IdempotencyKeyReused("this idempotency_key was used to start a different run; use a new key")
    return run
