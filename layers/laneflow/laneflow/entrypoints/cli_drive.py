"""The `laneflow` commands that drive runs here, on the embedded engine, with progress:
`run`, `demo`, `approve`, `resume`, `redrive`, `reconcile`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laneflow.domain.errors import LaneflowError
from laneflow.domain.records import EventType, Run, RunStatus, Step, StepStatus
from laneflow.entrypoints.cli_base import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    command_services,
    err,
    hint,
    parse_input,
    plural,
    step_workers,
    summary,
    went_away,
)
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import liveness, local_engine, local_folder

if TYPE_CHECKING:  # the live view imports rich: only commands that draw it load it
    from laneflow.entrypoints.progress import Progress


def cmd_run(
    args: argparse.Namespace,
    *,
    workspace: str | None = None,
    flow: str | None = None,
    run_input: Any = None,
    settings: Settings | None = None,
    svc: Services | None = None,
) -> int:
    from laneflow.usecases.start_run import create_run

    svc = svc or command_services(args, settings)
    progress = _progress(args)
    try:
        if progress:
            progress.phase("reconciling runs left behind")
        _reconcile_quietly(svc, args)
        run_input = parse_input(args.input) if run_input is None else run_input
        options = {"gate": not args.no_gate}
        run = create_run(
            svc,
            workspace or args.workspace,
            flow or args.flow,
            run_input,
            model=args.model,
            account=args.account,
            options=options,
        )
    except BaseException:
        if progress:
            progress.close()
        raise
    if progress and not args.json:
        progress.say(f"laneflow: run {run.id} started: {run.workspace}/{run.flow}, {plural(len(run.steps), 'step')}")
    return drive_and_report(svc, run.tenant, run.id, args, progress=progress)


def _progress(args: argparse.Namespace) -> Progress | None:
    if args.quiet:
        return None
    from laneflow.entrypoints.progress import Progress

    return Progress()


def drive_and_report(
    svc: Services, tenant: str, run_id: str, args: argparse.Namespace, *, record: bool = True, progress: Progress | None = None
) -> int:
    """One drive of the run on the embedded engine, with progress (`progress`, else a new
    one unless --quiet): what the drive is doing while the run waits for it, then the run;
    then the record (on stdout unless `record` is False: a chained run's, under --json). A
    completed run whose flow chains to another (`then:`) drives that run next (`_then`)."""
    progress = progress or _progress(args)
    watch = _Watch(svc, tenant, run_id, args, progress)
    svc = _sized(svc, args, watch.before)
    try:
        if progress:
            progress.phase("starting the engine", watch.before)
        engine = local_engine(svc)
        result = engine.drive(tenant, run_id, on_tick=watch.tick, tick_s=TICK_S)
    except KeyboardInterrupt as interrupt:  # the engine has left the run resumable
        if progress:
            progress.close()
        if args.json and record:
            print(json.dumps(svc.store.get_run(tenant, run_id, detail=True).public(), ensure_ascii=False))
        return went_away(svc, tenant, run_id, interrupt, args)
    final = svc.store.get_run(tenant, run_id, detail=True)
    if progress:
        progress.phase(None, final)
        progress.close()
    if record and args.json:
        print(json.dumps(final.public(), ensure_ascii=False))
    elif record:
        print(summary(final, args))
    if final.status == RunStatus.completed:
        return _then(svc, final, args)
    if final.status == RunStatus.awaiting_approval:
        question = next((s.instruction for s in final.steps if s.status == StepStatus.awaiting_approval), "")
        err(f"run {final.id} is waiting for a person: {question}")
        err(f"  answer it: {hint(args, 'approve', final.id)}")
        err(f"  reject it: {hint(args, 'approve', final.id, '--reject')}")
        return EXIT_OK
    err(f"run {final.id} {final.status}: {final.error or result.error or 'no reason recorded'}")
    return EXIT_FAILED


# How often a drive here looks whether its execution has ended: the command's own ending
# waits up to this long after the run's (the progress view is redrawn at most every 0.25 s).
TICK_S = 0.02


def _sized(svc: Services, args: argparse.Namespace, run: Run) -> Services:
    """`svc` with as many step workers as a drive of this run is given (`step_workers`: a
    count given, else the default for its size)."""
    from laneflow.settings import settings

    size = step_workers(getattr(args, "step_workers", None), settings(), run)
    if size == svc.settings.step_workers:
        return svc
    return dataclasses.replace(svc, settings=svc.settings.model_copy(update={"step_workers": size}))


class _Watch:
    """What a drive's ticks do: redraw the progress (every quarter second at most), say what
    the drive is doing until it has claimed the run, and name each question a step asks a
    person with the command that answers it."""

    def __init__(self, svc: Services, tenant: str, run_id: str, args: argparse.Namespace, progress: Progress | None):
        self.svc, self.tenant, self.run_id, self.args, self.progress = svc, tenant, run_id, args, progress
        self.before = svc.store.get_run(tenant, run_id, detail=True)
        self.drives = self.before.drives  # before this drive claims it
        self.last = 0.0
        self.asked: set[str] = set()

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last < (0.25 if self.progress else 1.0):  # --quiet: only its questions, once a second
            return
        self.last = now
        if not self.progress:
            self._questions()
            return
        run = self.svc.store.get_run(self.tenant, self.run_id, detail=True)  # the gate's waits are events
        # Until its first state has claimed the run (a new drive counted), the engine is starting the drive.
        self.progress.phase(None if run.drives > self.drives else "starting its drive", run)
        if any(_asking(s) for s in run.steps):
            self._questions()

    def _questions(self) -> None:
        from laneflow.usecases.answer import waiting_questions

        for q in waiting_questions(self.svc, self.tenant, run_id=self.run_id):
            if q.id in self.asked:
                continue
            self.asked.add(q.id)
            line = f"step {q.index} ({q.agent}) asks a person: {q.question}"
            answer = f"  answer it: {hint(self.args, 'answer', self.run_id, str(q.index), 'YOUR ANSWER')}"
            for said in (line, answer):
                if self.progress:
                    self.progress.say(f"laneflow: {said}")
                else:
                    err(said)


def _asking(step: Step) -> bool:
    """A running step whose last ask event asked (not yet answered or given up on)."""
    if step.status != StepStatus.running:
        return False
    asks = [e for e in step.events if e.type == EventType.ask]
    return bool(asks) and asks[-1].text.startswith("asked a person")


def _then(svc: Services, final: Run, args: argparse.Namespace) -> int:
    """After a completed run: the run its flow's `then:` started. Queued here (nothing else
    drives runs in this process), it is driven now, with its own summary (under --json,
    stdout keeps the first run's record alone); one another process drives is named."""
    if final.options.get("then_error"):
        err(f"run {final.id}: its chained run was not started: {final.options['then_error']}")
        return EXIT_FAILED
    if not final.then_run:
        return EXIT_OK
    chained = svc.store.get_run(final.tenant, final.then_run, steps=False)
    if chained.status != RunStatus.queued or chained.drives:
        if not args.json and not args.quiet:
            err(
                f"run {final.id} chained to run {chained.id} (flow {chained.flow}); follow it: {hint(args, 'show', chained.id, '--follow')}"
            )
        return EXIT_OK
    if not args.json and not args.quiet:
        err(f"run {final.id} chains to flow {chained.flow}: run {chained.id} started")
    return drive_and_report(svc, final.tenant, chained.id, args, record=not args.json)


def _reconcile_quietly(svc: Services, args: argparse.Namespace) -> None:
    """At the start of `run`: settle what crashed runs left behind (journal, attempts whose
    worker is gone, stopped runs) and say which runs need a re-drive and how to give it,
    without driving them: this command drives its own run only (`laneflow serve` and
    `laneflow reconcile` re-drive the others)."""
    from laneflow.usecases.reconcile import reconcile

    report = reconcile(svc, liveness(), redrive=None)
    if not report.to_redrive or args.json or args.quiet:
        return
    for run_id in report.to_redrive:
        try:
            run = svc.store.get_run(svc.settings.tenant, run_id, steps=False, detail=False)
            what = f"run {run_id} ({run.workspace}/{run.flow}) " + (
                "was interrupted" if run.drives else "is queued and nothing drives it"
            )
        except LaneflowError:  # another tenant's run (reconcile sees every tenant's)
            what = f"run {run_id} was interrupted"
        err(
            f"{what}: {hint(args, 'resume', run_id)} re-drives it now "
            f"({hint(args, 'reconcile')} re-drives every such run; {hint(args, 'stop', run_id)} ends it)"
        )


def cmd_reconcile(args: argparse.Namespace) -> int:
    from laneflow.usecases.reconcile import reconcile

    svc = command_services(args)
    engine = local_engine(svc)
    driving: list[Any] = []

    def redrive(run: Run) -> None:
        if not args.json:
            err(f"re-driving {run.id} (drive {run.drives + 1})")
        driving[:] = [run]
        engine.drive(run.tenant, run.id)

    try:
        report = reconcile(svc, liveness(), redrive=redrive)
    except KeyboardInterrupt as interrupt:
        if not driving:
            raise
        return went_away(svc, driving[0].tenant, driving[0].id, interrupt, args)
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print("\n".join(report.lines()))
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    """Re-drive one run now, in this process, with progress: what reconcile would do for it
    (settle its journal, interrupt its attempts whose worker is gone, re-drive it, or close
    it past the drive limit or when its stop was requested)."""
    from laneflow.usecases.reconcile import reconcile, resumable_run

    svc = command_services(args)
    run = resumable_run(svc, liveness(), svc.settings.tenant, args.run)
    progress = _progress(args)
    try:
        if progress:
            progress.phase("reconciling what its last drive left", svc.store.get_run(run.tenant, run.id, detail=True))
        report = reconcile(svc, liveness(), redrive=None, tenant=run.tenant, run_id=run.id)
    except BaseException:
        if progress:
            progress.close()
        raise
    if run.id not in report.to_redrive:  # closed (stopped, or past the drive limit)
        final = svc.store.get_run(run.tenant, run.id, detail=True)
        if progress:
            progress.phase(None, final)
            progress.close()
        print(json.dumps(final.public(), ensure_ascii=False) if args.json else summary(final, args))
        err(f"run {final.id} {final.status}: {final.error or 'no reason recorded'}")
        return EXIT_OK if final.status == RunStatus.completed else EXIT_FAILED
    if progress and not args.json:
        progress.say(f"laneflow: resuming run {run.id} (drive {run.drives + 1}); completed steps are carried")
    return drive_and_report(svc, run.tenant, run.id, args, progress=progress)


def cmd_redrive(args: argparse.Namespace) -> int:
    """Send a failed run on from where it failed, driven here with progress as `run` drives
    one: its failed and skipped steps get a new attempt, its completed steps are kept."""
    from laneflow.adapters.workers import local_worker
    from laneflow.usecases.redrive import redrive_run

    svc = command_services(args)
    redriven = redrive_run(svc, svc.settings.tenant, args.run, driver=local_worker())
    run = redriven.run
    if not args.json and not args.quiet:
        err(f"redriving run {run.id} (redrive {run.redrives}): {redriven.steps} step(s) run again; completed steps are kept")
    return drive_and_report(svc, run.tenant, run.id, args)


def cmd_approve(args: argparse.Namespace) -> int:
    from laneflow.usecases.approve import answer_approval

    svc = command_services(args)
    run = answer_approval(svc, svc.settings.tenant, args.run, approve=not args.reject)
    if args.reject:
        if args.json:
            print(json.dumps(svc.store.get_run(run.tenant, run.id).public(), ensure_ascii=False))
        else:
            print(f"run {run.id} rejected: {run.status}")
        return EXIT_OK
    progress = _progress(args)
    if progress and not args.json:
        progress.say(f"laneflow: run {run.id} approved: continuing it in a new drive")
    return drive_and_report(svc, run.tenant, run.id, args, progress=progress)


def cmd_demo(args: argparse.Namespace) -> int:
    from laneflow.paths import project_root
    from laneflow.settings import settings
    from laneflow_dev import demo

    chosen = demo.DEMOS[args.example]
    root = project_root() / chosen.workspace
    if args.imitate and not chosen.imitates:
        err(f"the {args.example} demo runs on the stub model only (its steps call tools the imitation does not script)")
        return EXIT_INVALID
    if not args.imitate:
        svc = command_services(args)
        if chosen.writes:  # its steps keep files: a fresh copy beside the store, never examples/ itself
            root = _fresh_copy(root, local_folder(svc.store, svc.settings) / "demo-workspaces" / args.example)
        return cmd_run(args, workspace=str(root), flow=chosen.flow, run_input=chosen.input, svc=svc)
    # The Claude executor, through the real SDK, against a local imitation of the API.
    with demo.imitation() as api:
        from pydantic import SecretStr

        cfg = settings().model_copy(update={"anthropic_api_key": SecretStr(demo.IMITATION_KEY), "anthropic_base_url": api.url})
        args.model = args.model or demo.IMITATION_MODEL
        if not args.json and not args.quiet:
            err(f"Messages API imitation at {api.url} (model {args.model}); nothing leaves this machine")
        return cmd_run(args, workspace=str(root), flow=chosen.flow, run_input=chosen.input, settings=cfg)


def _fresh_copy(example: Path, target: Path) -> Path:
    """A fresh copy of an example workspace (what an earlier demo kept there is replaced)."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(example, target, symlinks=True)
    return target
