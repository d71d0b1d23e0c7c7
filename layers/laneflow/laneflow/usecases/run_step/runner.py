"""Running one step: claim an attempt, build the prompt, execute, record — fenced throughout.

Every write after the claim names the attempt (`AttemptRef`); a write the store refuses
means the attempt was ended by someone else (a stop, an interruption), and the runner stops
writing. A failure after the claim and before the executor starts (an unreadable agent) ends
the attempt with its reason, so no step is left `running` with nothing working on it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import logging
import secrets as _secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from laneflow.domain.delegation import DELEGATES
from laneflow.domain.errors import (
    AttemptEnded,
    Conflict,
    InvalidInput,
    LaneflowError,
    StepFailed,
    StepStopped,
)
from laneflow.domain.gate import READIED_LINE, below_minimum_line
from laneflow.domain.inbox import PEERS
from laneflow.domain.messages import RunStepRequest, StepReport
from laneflow.domain.prompt import SystemPrompt, build_system_prompt
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    EventType,
    FailureKind,
    ModelCall,
    Run,
    RunChanges,
    RunStatus,
    Step,
    StepChanges,
    StepStatus,
    utcnow,
)
from laneflow.domain.redaction import scrub_paths
from laneflow.domain.savings import calls_savings_usd
from laneflow.domain.settlement import BUDGET_SPENT, budget_spent, run_budget
from laneflow.domain.sizes import attempt_size
from laneflow.domain.workers import WorkerRef
from laneflow.domain.workspace import Agent, Workspace, load_agent, load_workspace
from laneflow.ports import Services, StepOutcome, WorkingCopy
from laneflow.usecases.prefix_gate import PrefixClaimant, attempt_claimant
from laneflow.usecases.run_step.cache_break import find_cache_break, step_prefix
from laneflow.usecases.run_step.delegation import Delegation
from laneflow.usecases.run_step.inbox import attempt_inbox, group_peers
from laneflow.usecases.run_step.job import attempt_job
from laneflow.usecases.run_step.judge import judge
from laneflow.usecases.run_step.message import (
    Briefing,
    EarlierAttempt,
    brief,
    user_message,
)
from laneflow.usecases.run_step.output import check_output
from laneflow.usecases.run_step.recorder import StepRecorder, capture_full, captured
from laneflow.usecases.run_step.secrets import AttemptSecrets, hold_run_secrets, load_secrets, release_run_secrets
from laneflow.usecases.start_run import run_account
from laneflow.usecases.wait_for_lead import open_gate

log = logging.getLogger("laneflow.step")


@dataclass(frozen=True)
class PreparedAttempt:
    """What an attempt works with, read afresh for it: the workspace (with the run's
    account), the agent, the step's system prompt, and the attempt's own working copy of
    the workspace (the holder's to discard)."""

    workspace: Workspace
    agent: Agent
    prompt: SystemPrompt
    copy: WorkingCopy


class GateOpener(Protocol):
    """A lane lead's gate: releases its waiting siblings, saying why and when the lead's reply
    began (now, when not given), with `note` for every sibling's trace (its prefix cannot be
    cached). Returns how many it released."""

    def __call__(self, why: str, at: str | None = None, note: str | None = None) -> int: ...


# -- the attempt loop ---------------------------------------------------------------------------


class StepRunner:
    """Runs a claimed step through its attempts: retries what was not its own fault, up to
    `retries:` more attempts, telling each new attempt why the earlier ones failed."""

    def __init__(
        self,
        svc: Services,
        run: Run,
        step: Step,
        attempt: Attempt,
        *,
        briefing: Briefing,
        cycle: int = 0,
        open_gate: GateOpener | None = None,
        role: str = "solo",
    ):
        self.svc, self.run, self.step, self.attempt, self.cycle = svc, run, step, attempt, cycle
        self.open_gate = open_gate  # set for a lane's lead: releases its waiting siblings
        self.role = role  # solo, lead or sibling: a lead or a lone step claims its prefix (prefix_gate)
        self.claimant: PrefixClaimant | None = None  # the current attempt's side of its prefix's record
        self.prepared: PreparedAttempt | None = None  # the first attempt's, built before its claim
        # A readied sibling's gate (the embedded engine's early start): its first attempt's
        # first request waits for the lead's reply at it.
        self.hold: str | None = None
        self.copy: WorkingCopy | None = None  # the folder the current attempt works in
        self.recorder: StepRecorder | None = None  # the current attempt's sink (what it spent)
        self.secrets: AttemptSecrets | None = None  # the current attempt's declared secrets
        # The step's cached prefix and, once a first call wrote it, why it was not read
        # (written with the attempt's end).
        self.prefix: dict[str, Any] | None = None
        self.cache_break: dict[str, str] | None = None
        self.cache_ttl: dict[str, str] = {}  # the TTL its writes asked for, and why (prefix_gate)
        self.spec, self.handoff = briefing.spec, briefing.handoff
        # What earlier attempts of this pass ended with (a retry, or a resume after a crash):
        # each new attempt is told the truth about why it runs again.
        self.history = list(briefing.history)
        self.message = briefing.message  # what the current attempt is sent (written with its claim)
        self.redrive = briefing.redrive  # the redrive it runs in: every later attempt is told it too
        # `retries:` counts failures (`EarlierAttempt.counts` says which).
        self.failures = sum(1 for a in self.history if a.counts)

    @property
    def ref(self) -> AttemptRef:
        return AttemptRef.of(self.run.tenant, self.attempt)

    def _note(self, type: EventType, text: str, data: dict[str, Any] | None = None) -> None:
        self.svc.store.add_event(
            self.run.tenant, self.run.id, self.step.index, Event(type=type, text=text, data=data), attempt=self.ref
        )

    def run_attempts(self) -> StepReport:
        # The run's secrets stay masked while this step works here, through the end of its
        # last attempt's record; then they are let go (dropped with the run's last step here).
        hold_run_secrets(self.svc, self.run)
        try:
            return self._run_attempts()
        finally:
            try:
                self._metrics()
            finally:
                release_run_secrets(self.svc, self.run)

    def _metrics(self) -> None:
        if not self.svc.telemetry.metrics_on:  # metrics are off locally: no read for them
            return
        step = self.svc.store.get_step(self.run.tenant, self.run.id, self.step.index, detail=True)
        started = step.started_at and _dt.datetime.fromisoformat(step.started_at.replace("Z", "+00:00"))
        waited = [e for e in step.events if e.type == EventType.gate and "waiting" in e.text]
        gate_wait = None
        if waited and started:
            gate_wait = (started - _dt.datetime.fromisoformat(waited[0].t.replace("Z", "+00:00"))).total_seconds() * 1000
        spent = sum(c.ms for c in step.calls)
        self.svc.telemetry.step_metrics(
            cost_usd=step.cost_usd, duration_ms=spent, calls=step.calls, gate_wait_ms=gate_wait, savings_usd=step.savings_usd
        )

    def _run_attempts(self) -> StepReport:
        while True:
            self.recorder = None
            self.svc.telemetry.bind(attempt=self.attempt.n)
            try:
                if self.history:  # the first attempt's start is its record; a later one says why it runs
                    told = {"told": [a.reason for a in self.history], "kinds": [a.kind or a.status for a in self.history]}
                    self._note(EventType.attempt, f"attempt {self.attempt.n} started on model {self.step.model}", told)
                outcome, data, recorder = self._attempt()
            except AttemptEnded:
                return self._report()
            except Exception as error:
                failure = self._failure_of(error)
                if failure is None:
                    return self._interrupted()
            else:
                self._complete(outcome, data, recorder)
                return self._report()
            finally:
                self._discard()  # however the attempt ended, its copy of the workspace and its secret files go

            if self.svc.leaving.is_set():
                # The attempt ended because its worker is going away (Ctrl-C): not its doing.
                return self._interrupted()
            if not self._end_failed(*failure):
                return self._report()

    def _failure_of(self, error: Exception) -> tuple[str, bool, bool, FailureKind] | None:
        """(reason, retryable, stopped, kind) for an attempt that raised `error`; None when it was
        interrupted because its worker is leaving."""
        if isinstance(error, StepFailed):
            return error.reason, error.retryable, isinstance(error, StepStopped), error.kind
        if isinstance(error, InvalidInput):  # an agent that cannot be read: say where (file, line)
            return error.one_line(), False, False, FailureKind.other
        if isinstance(error, LaneflowError):
            return str(error).splitlines()[0], False, False, FailureKind.other
        # A bug or an unexpected library error: end the attempt, say what.
        if self.svc.leaving.is_set():
            return None
        log.exception("step %s of %s: attempt %s crashed", self.step.index, self.run.id, self.attempt.n)
        return f"{type(error).__name__}: {error}", False, False, FailureKind.other

    def _complete(self, outcome: StepOutcome, data: Any, recorder: StepRecorder) -> None:
        try:
            self.svc.store.end_attempt(
                self.ref,
                AttemptStatus.completed,
                step=StepChanges(
                    status=StepStatus.completed,
                    result=outcome.result,
                    conclusion=outcome.conclusion,
                    data=data,
                    error=None,
                    cost_usd=round(self.step.cost_usd + recorder.cost_usd, 6),
                    finished_at=utcnow(),
                    **self._cache_changes(),
                ),
                calls=list(recorder.spans.values()),
            )
        except AttemptEnded:
            pass
        else:
            self._add_spend(recorder.cost_usd)
        self.svc.crashpoints.reached("after-result")

    def _end_failed(self, reason: str, retryable: bool, stopped: bool, kind: FailureKind) -> bool:
        """Record a failed attempt; True when a retry has been claimed and the loop goes on."""
        store = self.svc.store
        # Masked here too (the store masks what it writes): the next attempt's message is
        # built from it in memory and must read as it would after a resume.
        reason = self.svc.redactor(scrub_paths(reason, self.run.workspace_uri))
        cost = self.recorder.cost_usd if self.recorder else 0.0  # what the failed attempt spent counts
        self.step.cost_usd = round(self.step.cost_usd + cost, 6)
        retry = retryable and (kind == FailureKind.memory or self.failures < self.spec.retries)
        try:
            self._note(EventType.error, f"attempt {self.attempt.n} failed: {reason}")
            ends: dict[str, Any] = {} if retry else {"status": StepStatus.failed, "finished_at": utcnow()}
            changes = StepChanges(error=reason, cost_usd=self.step.cost_usd, **ends, **self._cache_changes())
            ended = AttemptStatus.stopped if stopped else AttemptStatus.failed
            spans: list[ModelCall] = list(self.recorder.spans.values()) if self.recorder else []
            store.end_attempt(self.ref, ended, reason=reason, step=changes, calls=spans, reason_kind=None if stopped else kind)
        except AttemptEnded:
            return False
        self._add_spend(cost)
        if not retry:
            return False
        if self.open_gate:
            # Siblings do not wait through the lead's retries: they start and write the prefix themselves.
            self.open_gate(f"the lead's attempt {self.attempt.n} failed before its reply began")
        self.history.append(EarlierAttempt(n=self.attempt.n, status=AttemptStatus.failed, reason=reason, kind=kind))
        self.failures += kind != FailureKind.memory
        self.message = user_message(self.step, self.spec, self.handoff, self.history, redrive=self.redrive)
        try:
            self.attempt = store.claim_attempt(
                self.run.tenant,
                self.run.id,
                self.step.index,
                token=_secrets.token_hex(16),
                started_at=utcnow(),
                expect_status=(StepStatus.running,),
                worker=self.attempt.worker,
                message=self.message,
            )
        except Conflict:
            return False
        return True

    def _add_spend(self, usd: float) -> None:
        """What the attempt that just ended spent joins the run's cost at once, so the run's
        budget holds inside a group (the next step's start and every running step's next
        turn are checked against it). The group's settlement sets the run's cost to its
        steps' sum again, so an add lost to a crash in between is made good there; a run
        without a budget waits for it (a write a step saved: 1 of its ~5 DynamoDB units)."""
        if usd > 0 and run_budget(self.run) is not None:
            self.svc.store.add_run_cost(self.run.tenant, self.run.id, usd)

    def _cache_changes(self) -> dict[str, Any]:
        """The step's prefix and cache_break, as this attempt found them (nothing if it sent none)."""
        if self.prefix is None:
            return {}
        # What the cache saved: the step's earlier attempts' and this one's (domain/savings.py).
        spans = self.recorder.spans.values() if self.recorder else ()
        self.step.savings_usd = round(self.step.savings_usd + calls_savings_usd(spans, self.step.model), 6)
        return {"prefix": self.prefix, "cache_break": self.cache_break, "savings_usd": self.step.savings_usd, **self.cache_ttl}

    def _on_cache_write(self, layers: list[Any]) -> None:
        assert self.prefix is not None
        self.cache_break = find_cache_break(
            self.svc, self.run.tenant, self.run.id, self.step.index, model=self.step.model, layers=layers, prefix=self.prefix
        )

    def _attempt(self) -> tuple[StepOutcome, Any, StepRecorder]:
        svc, run, step = self.svc, self.run, self.step
        if self.prepared is not None:  # built before the claim, layers written with it
            prepared, self.prepared = self.prepared, None
        else:
            prepared = prepare(svc, run, step)
            svc.store.set_prompt_layers(self.ref, prepared.prompt.records())
        ws, agent, prompt, self.copy = prepared.workspace, prepared.agent, prepared.prompt, prepared.copy
        if agent.sandboxed and not svc.sandbox:
            # Routed by what the run recorded as it started; its agent.md says otherwise now.
            raise StepFailed(
                f"agent {agent.name} runs programs or says sandbox: true, so its steps run in a sandbox worker;"
                " this worker is not one (was its agent.md changed after the run started?)",
                retryable=False,
            )
        prior = svc.store.get_step(run.tenant, run.id, step.index, detail=True)
        budget = None
        if agent.settings.budget is not None:
            budget = agent.settings.budget - self.step.cost_usd
            if budget <= 0:
                raise StepFailed(f"its budget of ${agent.settings.budget:.2f} is spent", retryable=False)
        self.recorder = recorder = StepRecorder(
            svc=svc,
            ref=self.ref,
            base_n=len(prior.calls),
            redact=svc.redactor,
            capture=ws.settings.capture == "full",
            _captured=captured(prior),
            _capture_full=capture_full(prior),
            on_first_event=(lambda: self.open_gate("the lead's reply began", at=utcnow())) if self.open_gate else None,
            on_uncacheable=self._uncacheable,
            run_budget=run_budget(run),
        )
        recorder.inbox = attempt_inbox(svc, run, step, self.attempt, agent, recorder, capture=ws.settings.capture == "full")
        if svc.sandbox:
            recorder.event(
                EventType.info,
                "sandbox worker: the step runs whole here, in a scratch copy of the workspace",
                {"worker": self.attempt.worker.model_dump(mode="json") if self.attempt.worker else None},
            )
        sized = attempt_size(agent.settings.size, ((a.kind, a.reason) for a in self.history))
        if sized.up_from:  # one size up after an out-of-memory kill: the trace says so
            recorder.event(EventType.info, sized.line(), sized.as_data())
        # After the claim, before the model: a secret not set fails the attempt here.
        self.secrets = load_secrets(svc, run, agent, recorder)
        job = attempt_job(
            svc,
            run,
            step,
            prepared,
            user=self.message,
            attempt=self.attempt.n,
            budget=budget,
            size=sized.size if sized.up_from else agent.settings.size,
            secret_env=dict(self.secrets.env),
        )
        recorder.step_budget = budget
        if agent.settings.delegates:
            recorder.delegator = Delegation(svc, run, ws, recorder, job, (agent.name,), tuple(agent.settings.delegates))
        if self.hold:  # the first attempt only: a retry is no longer a sibling waiting for its lead
            job, self.hold = dataclasses.replace(job, hold=self.hold), None
            recorder.event(EventType.gate, READIED_LINE)
        self.prefix, self.cache_break = step_prefix(svc, job), None
        self.claimant, job = attempt_claimant(svc, run, job, recorder, role=self.role, note=self._note, open_gate=self.open_gate)
        self.cache_ttl = {"cache_ttl": job.cache_ttl, "cache_ttl_reason": self.claimant.ttl_reason}
        layers = prompt.records()
        recorder.on_cache_write = lambda: self._on_cache_write(layers)
        svc.crashpoints.reached("rescue-running" if step.rescue_of is not None else "executor-started")
        outcome = svc.executor(step.model).execute(job, recorder)
        data = check_output(self.spec, outcome)
        if self.spec.verify_judge:
            judge(self.svc, self.run, self.step, ws, job, self.spec.verify_judge, outcome, recorder)
        self._keep(agent, recorder)
        return outcome, data, recorder

    def _uncacheable(self, tokens: int, minimum: int) -> None:
        """The prefix is below its model's minimum cacheable length: nothing it writes could be
        read, so nobody waits for it (another run's steps, a lead's siblings: every trace of
        the lane says why)."""
        if self.claimant is not None:
            self.claimant.release("its prefix cannot be cached")
        if self.open_gate is None:  # only a lead's siblings are told
            return
        note = below_minimum_line(self.step.agent or "", tokens, self.step.model, minimum)
        self._note(EventType.gate, note, {"prefix_tokens": tokens, "min_cacheable": minimum})
        self.open_gate("the lead's prefix cannot be cached", note=note)

    def _keep(self, agent: Agent, recorder: StepRecorder) -> None:
        """The attempt completed: what it wrote that outlives it goes back to the workspace
        (the tenant's S3 prefix in the cloud), and only while this attempt is still the
        running one, so an attempt a stop or an interruption ended meanwhile keeps nothing."""
        kept = self.copy.changed(agent.path) if self.copy is not None else []
        if self.copy is None or not kept:
            return
        self.svc.store.heartbeat(self.ref, utcnow())  # AttemptEnded if it was ended meanwhile
        try:
            self.copy.keep(kept)
        except Exception as error:  # S3 or disk: the attempt did not complete
            log.warning("step %s of %s: keeping its files failed: %s", self.step.index, self.run.id, error)
            raise StepFailed(
                f"what it wrote could not be kept in the workspace ({type(error).__name__})", retryable=True
            ) from None
        recorder.event(EventType.info, f"kept in the workspace: {', '.join(kept)}", {"kept": kept})

    def _discard(self) -> None:
        """Release the current attempt's claim on its prefix if its reply never began, and
        remove its secret files and working copy (a local workspace is left as it is)."""
        if self.claimant is not None:
            self.claimant.release(f"run {self.run.id}'s attempt ended before its reply began")
            self.claimant = None
        if self.secrets is not None:
            self.secrets.close()
            self.secrets = None
        if self.copy is not None:
            self.copy.discard()
            self.copy = None

    def _interrupted(self) -> StepReport:
        """Mark this attempt interrupted by its exact identity, the way reconcile does for a
        worker that went away: the next drive retries it and tells it why."""
        from laneflow.usecases.reconcile import (
            interrupt,  # reconcile builds on the drive, which builds on this module
        )

        run = self.svc.store.get_run(self.run.tenant, self.run.id, steps=False)
        spent = self.recorder.cost_usd if self.recorder else 0.0  # what it spent counts, as for a failure
        calls = list(self.recorder.spans.values()) if self.recorder else []
        if (
            interrupt(self.svc, self.run.tenant, run, self.attempt, calls=calls, cost_usd=round(self.step.cost_usd + spent, 6))
            == "interrupted"
        ):
            self._add_spend(spent)
        return self._report()

    def _report(self) -> StepReport:
        return reported(self.svc, self.run.tenant, self.run.id, self.step.index)


WAITED_TO_START = "run stopped by a person while this step waited to start"


def reported(svc: Services, tenant: str, run_id: str, index: int) -> StepReport:
    """What the handler answers for a step: its status and attempts as stored now."""
    status, attempts = svc.store.get_step_status(tenant, run_id, index)
    return StepReport(index=index, status=status, attempts=attempts)


def prepare(svc: Services, run: Run, step: Step) -> PreparedAttempt:
    """Give the attempt its own working copy of the workspace (`checkout`), read the
    workspace (with the run's account) and the agent from it afresh and build the step's
    system prompt. The copy is the caller's to discard; if reading fails it is discarded here."""
    # Its agent's folder, and those of the agents it may delegate to (fixed as the run started).
    reaches = run.options.get(DELEGATES, {}).get(step.agent or "", [])
    copy = svc.folders.checkout(run.workspace_uri, agents=(step.agent or "", *reaches))
    try:
        ws = load_workspace(copy.root, run_account(run))
        agent = load_agent(ws, step.agent or "")
        peers = group_peers(svc, run, step) if PEERS in agent.settings.tools else None
        return PreparedAttempt(workspace=ws, agent=agent, prompt=build_system_prompt(ws, agent, peers=peers), copy=copy)
    except BaseException:
        copy.discard()
        raise


def run_step(svc: Services, req: RunStepRequest, worker: WorkerRef) -> StepReport:
    """Claim the step's next attempt and run it to its end. A step that already ended (a
    re-delivered invocation) or is claimed by another worker is reported, not run again; a
    step reached after a stop is skipped, never started. A lane's lead opens its gate when
    its reply begins, and on every way out without one."""
    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index
    # Where the model's key is in Secrets Manager, this step runner reads it now, before the
    # step records anything, so every record is masked from its first line.
    svc.secret_values()
    opener = None
    if req.step.role == "lead":
        opener = functools.partial(open_gate, svc, tenant, run_id, group=req.group, cycle=req.cycle, lane=req.lane, lead=index)
    ended = False
    try:
        report = _run_step(svc, req, opener, worker)
        ended = True
        return report
    finally:
        if opener:
            # Its siblings start whatever happened. The reserve waiting for the lead's pool
            # slot goes only once the lead has ended: an error leaving here is retried by the
            # state machine (the next invocation ends it) or caught by StepCrashed (which does).
            opener(why="the lead ended" if ended else "the lead's invocation failed before its reply began", lead_ended=ended)


def _run_step(svc: Services, req: RunStepRequest, opener: Callable[..., int] | None, worker: WorkerRef) -> StepReport:
    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index
    # Without its input (a fan-out's can be large): the attempt reads it by itself (get_run_input).
    run = svc.store.get_run(tenant, run_id, steps=False, input=False)
    step = svc.store.get_step(tenant, run_id, index)
    if step.status != StepStatus.pending:
        return StepReport(index=index, status=step.status, attempts=step.attempts)
    if svc.leaving.is_set():  # this worker is going away: claim nothing; the next drive runs it
        return StepReport(index=index, status=step.status, attempts=step.attempts)
    if run.stop_requested or run.status.ended:
        return _skip(svc, run, index, WAITED_TO_START)
    if spent := budget_spent(run):
        # The run's budget holds inside a group: a step reached once it is spent never starts,
        # and the run ends for the budget's reason (as it would between groups).
        try:
            svc.store.update_run(tenant, run_id, RunChanges(error=spent), expect_status=(RunStatus.running,))
        except Conflict:
            pass
        return _skip(svc, run, index, BUDGET_SPENT)
    # Read the workspace and build the prompt before claiming, so its layers are written
    # with the claim. If that fails, the attempt is still claimed and then ended with the
    # reason (the runner meets the same failure): no step stays pending or running silently.
    try:
        prepared: PreparedAttempt | None = prepare(svc, run, step)
    except Exception:  # reported through the attempt below
        prepared = None
    try:
        return _claim_and_run(svc, req, run, step, prepared, opener, worker)
    finally:
        if prepared:
            prepared.copy.discard()  # if no attempt took it (the claim went elsewhere, a crash)


def _skip(svc: Services, run: Run, index: int, reason: str) -> StepReport:
    """Skip a step that was to start, with the reason; if it started or ended meanwhile, its own record says how."""
    try:
        step = svc.store.update_step(
            run.tenant,
            run.id,
            index,
            StepChanges(status=StepStatus.skipped, skip_reason=reason),
            expect_status=(StepStatus.pending,),
        )
    except Conflict:
        step = svc.store.get_step(run.tenant, run.id, index)
    return StepReport(index=index, status=step.status, attempts=step.attempts)


def _claim_and_run(
    svc: Services,
    req: RunStepRequest,
    run: Run,
    step: Step,
    prepared: PreparedAttempt | None,
    opener: Callable[..., int] | None,
    worker: WorkerRef,
) -> StepReport:
    tenant, run_id, index = req.run.tenant, req.run.run_id, req.step.index
    # What this attempt is sent is known before it is claimed (nothing in it depends on the
    # attempt's number), so the claim records it: the step's `message` costs no write.
    briefing = brief(svc, run, step, cycle=req.cycle)
    op_id = req.op.op_id(group=req.group, cycle=req.cycle, index=index)
    svc.store.journal_begin(tenant, run_id, op_id, index)
    svc.crashpoints.reached("after-journal")
    token = _secrets.token_hex(16)
    try:
        attempt = svc.store.claim_attempt(
            tenant,
            run_id,
            index,
            token=token,
            started_at=utcnow(),
            op_id=op_id,
            worker=worker,
            layers=prepared.prompt.records() if prepared else None,
            message=briefing.message,
        )
    except Conflict:
        return reported(svc, tenant, run_id, index)
    if attempt.token != token:
        # A re-delivered invocation: the journal gave back what the first one claimed. That
        # attempt is its worker's, not ours: report, never run it twice.
        return reported(svc, tenant, run_id, index)
    svc.crashpoints.reached("after-claim")
    running = step.model_copy(update={"status": StepStatus.running})
    lead_opener = (lambda why, at=None, note=None: opener(why=why, at=at, note=note)) if opener else None
    runner = StepRunner(svc, run, running, attempt, briefing=briefing, cycle=req.cycle, open_gate=lead_opener, role=req.step.role)
    runner.prepared, runner.hold = prepared, req.hold
    return runner.run_attempts()
