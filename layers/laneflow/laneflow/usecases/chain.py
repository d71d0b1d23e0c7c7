"""Starting the run a completed run chains to (its flow's `then:`), from the run's end.

EndRun calls this for a run that completed, every time it is told of the end (its own drive,
a re-delivered EndRun, reconcile closing it): the chained run is made through the same start
as the API's (`start_run_idempotent.start_in`) with an idempotency key derived from the run's
id (`chain.then_key`), so it is made once however often the end is told. Its drive starts
where this deployment can start drives (the cloud's state machine, `laneflow serve`);
elsewhere it is left `queued`, and whoever ended the run drives it next: `laneflow run` and
`laneflow resume` after their own run, `laneflow reconcile` in the same pass that re-drove
the run to its end (`Reconciler._drive_chain`); any later reconcile's re-drive of queued
runs also covers a chained run whose drive never started.

The finished run records the chained run's id (`options.then_run`, shown as `then_run`),
or why it could not be started (`options.then_error`: the chained flow is no longer valid,
the filled input does not fit it, the chain is too long).
"""

from __future__ import annotations

import logging
from typing import Any

from laneflow.domain.chain import CHAIN_DEPTH, CHAIN_LIMIT, CHAINED_FROM, THEN_ERROR, THEN_RUN, fill_then_input, then_key
from laneflow.domain.errors import Conflict, LaneflowError
from laneflow.domain.records import Run, RunChanges, RunStatus
from laneflow.ports import Services
from laneflow.usecases.start_run import run_account
from laneflow.usecases.start_run_idempotent import StartRun, start_in

log = logging.getLogger("laneflow.chain")


def start_chained(svc: Services, run: Run) -> str | None:
    """Start the run `run`'s flow chains to, once; its id, or None (no `then:`, the run did
    not complete, or the chained run could not be made: the run's `then_error` says why)."""
    then = (run.flow_spec or {}).get("then")
    if run.status != RunStatus.completed or not isinstance(then, dict):
        return None
    depth = int(run.options.get(CHAIN_DEPTH, 0)) + 1
    if depth > CHAIN_LIMIT:
        _note(svc, run, {THEN_ERROR: f"not started: {CHAIN_LIMIT} runs have chained in a row"})
        return None
    steps = svc.store.get_steps(run.tenant, run.id)
    run_input = fill_then_input(then.get("input") or {}, run.input, steps)
    options: dict[str, Any] = {CHAINED_FROM: run.id, CHAIN_DEPTH: depth}
    if "gate" in run.options:
        options["gate"] = run.options["gate"]
    try:
        request = StartRun(
            workspace=run.workspace, flow=str(then["flow"]), input=run_input, model=run.model, idempotency_key=then_key(run.id)
        )
        started = start_in(svc, run.tenant, request, lambda: run.workspace_uri, account=run_account(run), options=options)
    except (LaneflowError, ValueError) as error:  # the flow or its input: the run records why
        reason = str(error).splitlines()[0]
        problems = getattr(error, "problems", None)
        if problems:
            reason += ": " + "; ".join(str(p) for p in problems[:5])
        log.warning("run %s: its chained run (flow %s) was not started: %s", run.id, then.get("flow"), reason)
        _note(svc, run, {THEN_ERROR: svc.redactor(reason)})
        return None
    if run.options.get(THEN_RUN) != started.run.id:
        _note(svc, run, {THEN_RUN: started.run.id})
    return started.run.id


def _note(svc: Services, run: Run, what: dict[str, Any]) -> None:
    """Add to the ended run's options (nothing else writes them once it has ended)."""
    current = svc.store.get_run(run.tenant, run.id, steps=False, detail=False)
    try:
        svc.store.update_run(
            run.tenant, run.id, RunChanges(options={**current.options, **what}), expect_status=(RunStatus.completed,)
        )
    except Conflict:  # pragma: no cover - a completed run stays completed
        pass
