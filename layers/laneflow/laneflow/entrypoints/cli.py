"""`laneflow`: run flows locally on the embedded engine and store, and inspect them.

Exit codes: 0 a completed run (or a clean check), 1 a failed run (or a check with errors),
2 bad input (workspace, flow, run input, flags), with one clear line on stderr; 130 and 143
when SIGINT (Ctrl-C) or SIGTERM ended a command that drives a run (the run stays resumable).
`--json` prints the record as JSON and nothing else on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from laneflow.adapters.logs import masked
from laneflow.domain import jsonsafe
from laneflow.domain.errors import InvalidInput, LaneflowError, Problem
from laneflow.domain.estimate import DEFAULT_OUTPUT_TOKENS
from laneflow.domain.records import Run, RunStatus, StepStatus
from laneflow.entrypoints.cli_views import asking_column, describe, runs_table
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store, local_drives, local_engine, local_folder

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def _err(message: str) -> None:
    print(f"laneflow: {masked(message)}", file=sys.stderr)  # a bad input may quote a secret back


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached a command that drives runs: this worker is going away. A
    KeyboardInterrupt, so the engine leaves the run resumable whichever signal it was."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal: 130 for SIGINT (and a plain KeyboardInterrupt), 143 for SIGTERM."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


@contextlib.contextmanager
def leaving_on_signals() -> Iterator[None]:
    """While a command drives runs, SIGINT and SIGTERM raise `Interrupted`, so the drive can
    mark its attempts interrupted and say how to go on. A second one during that cleanup
    exits at once: every write names its attempt and the claim journal records what landed,
    so reconcile finishes what the cleanup did not."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    caught: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        if caught:
            os.write(2, b"laneflow: interrupted again: leaving now; `laneflow reconcile` finishes the cleanup\n")
            os._exit(128 + signum)
        caught.append(signum)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _went_away(svc: Services, tenant: str, run_id: str, interrupt: KeyboardInterrupt) -> int:
    """What a person is told when SIGINT or SIGTERM ended a drive: where the run stands and
    how to go on."""
    run = svc.store.get_run(tenant, run_id, steps=False)
    if run.status.ended:
        _err(f"interrupted; run {run_id} had already ended ({run.status}): laneflow show {run_id}")
    elif run.status == RunStatus.awaiting_approval:
        _err(f"interrupted; run {run_id} is waiting for a person: laneflow approve {run_id} (or --reject)")
    else:
        _err(
            f"interrupted; run {run_id} is resumable: laneflow resume {run_id} "
            f"(or laneflow reconcile; laneflow stop {run_id} to end it)"
        )
    return _exit_code(interrupt)


def parse_input(text: str | None) -> Any:
    """`--input JSON` or `--input @FILE`, read strictly (`laneflow.jsonsafe`): NaN,
    Infinity, lone surrogates, nesting past its depth and text past its size are refused
    with `InvalidInput` naming `--input` (and the field), before anything is written."""
    if text is None:
        return {}
    source = "--input"
    if text.startswith("@"):
        path = Path(text[1:])
        source = f"--input file {path}"
        try:
            if path.stat().st_size > 4 * jsonsafe.MAX_CHARS:  # UTF-8 takes at most 4 bytes a character
                raise InvalidInput(f"{source}: more than {jsonsafe.MAX_CHARS:,} characters of JSON")
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidInput(f"{source}: cannot read it ({exc.strerror})") from None
        try:
            text = data.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{source}: not UTF-8 text (byte {exc.start})") from None
    return jsonsafe.loads(text, source)


def _services(args: argparse.Namespace, settings: Settings | None = None) -> Services:
    from laneflow.adapters.store import open_store
    from laneflow.settings import settings as from_env

    cfg = settings or from_env()  # first: a bad LANEFLOW_TENANT is refused before a store is made
    if getattr(args, "secrets", None):
        cfg = cfg.model_copy(update={"secrets_file": secrets_file(args.secrets)})
    if getattr(args, "drives", False) or getattr(args, "func", None) is cmd_serve:
        cfg = cfg.model_copy(update={"step_workers": step_workers(getattr(args, "step_workers", None), cfg)})
    return for_store(open_store(args.store), cfg)


MAX_DEFAULT_STEP_WORKERS = 4  # what a drive starts unless told: each is a Python of its own with laneflow imported


def step_workers(given: int | None, cfg: Settings) -> int:
    """How many step worker processes a command that drives runs gives the embedded engine:
    `--step-workers N`, else LANEFLOW_STEP_WORKERS, else one per core up to four on a machine
    of two cores or more, none on one core. A stub run's steps all go to one of them (its
    pretend cache is the process's); a Claude lane's released siblings spread over all of
    them, so on two cores two workers start a lane of 100 about a quarter sooner than one
    (docs/CHOICES.md, "Step workers")."""
    if given is not None:
        if not 0 <= given <= 32:
            raise InvalidInput(f"--step-workers {given}: give 0 (every step in this process) to 32")
        return given
    if cfg.step_workers_given:
        return cfg.step_workers
    cores = os.cpu_count() or 1
    return min(cores, MAX_DEFAULT_STEP_WORKERS) if cores >= 2 else 0


def secrets_file(given: str) -> str:
    """`--secrets FILE`: the dotenv file declared secrets are read from, as an absolute path
    (the settings carry it to every step this process runs, and to the sandbox workers it
    starts, which are given the engine's settings). A file that is not there is bad input,
    said before anything runs."""
    path = Path(given).expanduser().resolve()
    if not path.is_file():
        raise InvalidInput(f"--secrets {given}: no such file")
    return str(path)


# -- commands --------------------------------------------------------------------------------


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

    svc = svc or _services(args, settings)
    _reconcile_quietly(svc, args)
    run_input = parse_input(args.input) if run_input is None else run_input
    options = {"gate": not args.no_gate}
    run = create_run(
        svc, workspace or args.workspace, flow or args.flow, run_input, model=args.model, account=args.account, options=options
    )
    if not args.json and not args.quiet:
        _err(f"run {run.id} started: {run.workspace}/{run.flow}, {len(run.steps)} steps")
    return drive_and_report(svc, run.tenant, run.id, args)


def drive_and_report(svc: Services, tenant: str, run_id: str, args: argparse.Namespace, *, record: bool = True) -> int:
    """One drive of the run on the embedded engine, with progress; then the record (on
    stdout unless `record` is False: a chained run's, under --json). A completed run whose
    flow chains to another (`then:`) drives that run next (`_then`)."""
    from laneflow.entrypoints.progress import Progress

    progress = None if args.quiet else Progress()
    last = [0.0]

    def tick() -> None:
        now = time.monotonic()
        if progress and now - last[0] >= 0.25:
            last[0] = now
            progress.update(svc.store.get_run(tenant, run_id, detail=True))  # the gate's waits are events

    try:
        result = local_engine(svc).drive(tenant, run_id, on_tick=tick)
    except KeyboardInterrupt as interrupt:  # the engine has left the run resumable
        if progress:
            progress.close()
        if args.json and record:
            print(json.dumps(svc.store.get_run(tenant, run_id, detail=True).public(), ensure_ascii=False))
        return _went_away(svc, tenant, run_id, interrupt)
    final = svc.store.get_run(tenant, run_id, detail=True)
    if progress:
        progress.update(final)
        progress.close()
    if record and args.json:
        print(json.dumps(final.public(), ensure_ascii=False))
    elif record:
        print(summary(final))
    if final.status == RunStatus.completed:
        return _then(svc, final, args)
    if final.status == RunStatus.awaiting_approval:
        question = next((s.instruction for s in final.steps if s.status == StepStatus.awaiting_approval), "")
        _err(f"run {final.id} is waiting for a person: {question}")
        _err(f"  answer it: laneflow approve {final.id}   (or --reject)")
        return EXIT_OK
    _err(f"run {final.id} {final.status}: {final.error or result.error or 'no reason recorded'}")
    return EXIT_FAILED


def _then(svc: Services, final: Run, args: argparse.Namespace) -> int:
    """After a completed run: the run its flow's `then:` started. Queued here (nothing else
    drives runs in this process), it is driven now, with its own summary (under --json,
    stdout keeps the first run's record alone); one another process drives is named."""
    if final.options.get("then_error"):
        _err(f"run {final.id}: its chained run was not started: {final.options['then_error']}")
        return EXIT_FAILED
    if not final.then_run:
        return EXIT_OK
    chained = svc.store.get_run(final.tenant, final.then_run, steps=False)
    if chained.status != RunStatus.queued or chained.drives:
        if not args.json and not args.quiet:
            _err(f"run {final.id} chained to run {chained.id} (flow {chained.flow}); follow it: laneflow show {chained.id}")
        return EXIT_OK
    if not args.json and not args.quiet:
        _err(f"run {final.id} chains to flow {chained.flow}: run {chained.id} started")
    return drive_and_report(svc, final.tenant, chained.id, args, record=not args.json)


def _reconcile_quietly(svc: Services, args: argparse.Namespace) -> None:
    """At the start of `run`: settle what crashed runs left behind (journal, attempts whose
    worker is gone, stopped runs) and say which runs need a re-drive and how to give it,
    without driving them: this command drives its own run only (`laneflow serve` and
    `laneflow reconcile` re-drive the others)."""
    from laneflow.adapters.workers import Liveness
    from laneflow.usecases.reconcile import reconcile

    report = reconcile(svc, Liveness(), redrive=None)
    if not report.to_redrive or args.json or args.quiet:
        return
    store = f" --store {args.store}" if getattr(args, "store", None) else ""
    for run_id in report.to_redrive:
        try:
            run = svc.store.get_run(svc.settings.tenant, run_id, steps=False, detail=False)
            what = f"run {run_id} ({run.workspace}/{run.flow}) " + (
                "was interrupted" if run.drives else "is queued and nothing drives it"
            )
        except LaneflowError:  # another tenant's run (reconcile sees every tenant's)
            what = f"run {run_id} was interrupted"
        _err(
            f"{what}: laneflow resume {run_id}{store} re-drives it now "
            f"(laneflow reconcile{store} re-drives every such run; laneflow stop {run_id}{store} ends it)"
        )


def cmd_reconcile(args: argparse.Namespace) -> int:
    from laneflow.adapters.workers import Liveness
    from laneflow.usecases.reconcile import reconcile

    svc = _services(args)
    engine = local_engine(svc)
    driving: list[Any] = []

    def redrive(run: Run) -> None:
        if not args.json:
            _err(f"re-driving {run.id} (drive {run.drives + 1})")
        driving[:] = [run]
        engine.drive(run.tenant, run.id)

    try:
        report = reconcile(svc, Liveness(), redrive=redrive)
    except KeyboardInterrupt as interrupt:
        if not driving:
            raise
        return _went_away(svc, driving[0].tenant, driving[0].id, interrupt)
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print("\n".join(report.lines()))
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    """Re-drive one run now, in this process, with progress: what reconcile would do for it
    (settle its journal, interrupt its attempts whose worker is gone, re-drive it, or close
    it past the drive limit or when its stop was requested)."""
    from laneflow.adapters.workers import Liveness
    from laneflow.usecases.reconcile import reconcile, resumable_run

    svc = _services(args)
    run = resumable_run(svc, Liveness(), svc.settings.tenant, args.run)
    report = reconcile(svc, Liveness(), redrive=None, tenant=run.tenant, run_id=run.id)
    if run.id not in report.to_redrive:  # closed (stopped, or past the drive limit)
        final = svc.store.get_run(run.tenant, run.id, detail=True)
        print(json.dumps(final.public(), ensure_ascii=False) if args.json else summary(final))
        _err(f"run {final.id} {final.status}: {final.error or 'no reason recorded'}")
        return EXIT_OK if final.status == RunStatus.completed else EXIT_FAILED
    if not args.json and not args.quiet:
        _err(f"resuming run {run.id} (drive {run.drives + 1}); completed steps are carried")
    return drive_and_report(svc, run.tenant, run.id, args)


def cmd_serve(args: argparse.Namespace) -> int:
    from laneflow.adapters.local.workspaces import FolderWorkspaces
    from laneflow.entrypoints.serve import make_server, reconcile_runs, serve
    from laneflow.paths import project_root

    svc = _services(args)
    svc.workspaces = FolderWorkspaces(args.workspaces or project_root() / "examples")
    svc.drives = local_drives(svc)
    # Listen first: a port in use (exit 2) is said before this process re-drives any run.
    server = make_server(svc, args.host, args.port, quiet=False)
    try:
        lines = reconcile_runs(svc)
    except BaseException:
        server.server_close()
        raise
    for line in lines:
        _err(f"reconcile: {line}")
    _err(f"workspaces in {svc.workspaces.root}")
    serve(svc, server=server)
    return EXIT_OK


def cmd_init_store(args: argparse.Namespace) -> int:
    from laneflow.adapters.store.provision import init_store

    for line in init_store(args.store or "sqlite:///.laneflow/laneflow.db"):
        print(line)
    return EXIT_OK


def cmd_approve(args: argparse.Namespace) -> int:
    from laneflow.usecases.approve import answer_approval

    svc = _services(args)
    run = answer_approval(svc, svc.settings.tenant, args.run, approve=not args.reject)
    if args.reject:
        if args.json:
            print(json.dumps(svc.store.get_run(run.tenant, run.id).public(), ensure_ascii=False))
        else:
            print(f"run {run.id} rejected: {run.status}")
        return EXIT_OK
    if not args.json and not args.quiet:
        _err(f"run {run.id} approved: continuing it in a new drive")
    return drive_and_report(svc, run.tenant, run.id, args)


def cmd_stop(args: argparse.Namespace) -> int:
    from laneflow.usecases.stop import stop_run

    svc = _services(args)
    outcome = stop_run(svc, svc.settings.tenant, args.run)
    if args.json:
        print(json.dumps({"message": outcome.message, "run": outcome.run.public()}, ensure_ascii=False))
    else:
        print(outcome.message)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from laneflow.paths import project_root
    from laneflow.settings import settings
    from laneflow_dev import demo

    chosen = demo.DEMOS[args.example]
    root = project_root() / chosen.workspace
    if args.imitate and not chosen.imitates:
        _err(f"the {args.example} demo runs on the stub model only (its steps call tools the imitation does not script)")
        return EXIT_INVALID
    if not args.imitate:
        svc = _services(args)
        if chosen.writes:  # its steps keep files: a fresh copy beside the store, never examples/ itself
            root = _fresh_copy(root, local_folder(svc.store, svc.settings) / "demo-workspaces" / args.example)
        return cmd_run(args, workspace=str(root), flow=chosen.flow, run_input=chosen.input, svc=svc)
    # The Claude executor, through the real SDK, against a local imitation of the API.
    with demo.imitation() as api:
        from pydantic import SecretStr

        cfg = settings().model_copy(update={"anthropic_api_key": SecretStr(demo.IMITATION_KEY), "anthropic_base_url": api.url})
        args.model = args.model or demo.IMITATION_MODEL
        if not args.json and not args.quiet:
            _err(f"Messages API imitation at {api.url} (model {args.model}); nothing leaves this machine")
        return cmd_run(args, workspace=str(root), flow=chosen.flow, run_input=chosen.input, settings=cfg)


def _fresh_copy(example: Path, target: Path) -> Path:
    """A fresh copy of an example workspace (what an earlier demo kept there is replaced)."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(example, target, symlinks=True)
    return target


def cmd_check(args: argparse.Namespace) -> int:
    from laneflow.domain.flow import check_workspace

    problems: list[Problem] = check_workspace(args.workspace, getattr(args, "account", None))
    errors = [p for p in problems if p.severity == "error"]
    if args.json:
        print(json.dumps({"ok": not errors, "problems": [p.model_dump() for p in problems]}))
    else:
        for p in problems:
            print(str(p))
        warnings = len(problems) - len(errors)
        if errors:
            print(f"{args.workspace}: {len(errors)} error(s), {warnings} warning(s)", file=sys.stderr)
        else:
            print(f"{args.workspace}: ok" + (f" ({warnings} warning(s))" if warnings else ""))
    return EXIT_INVALID if errors else EXIT_OK  # a workspace with errors is bad input, as for `run`


def cmd_runs(args: argparse.Namespace) -> int:
    from laneflow.usecases.answer import waiting_questions

    svc = _services(args)
    from laneflow.usecases.list_runs import runs_with_live_cost

    runs = runs_with_live_cost(svc, svc.settings.tenant, limit=args.limit)
    asking: dict[str, list[int]] = {}  # run id -> the steps waiting on a person's answer
    for q in waiting_questions(svc, svc.settings.tenant):
        asking.setdefault(q.run_id, []).append(q.index)
    if args.json:
        print(json.dumps([{**r.public(), "asking": asking.get(r.id, [])} for r in runs]))
        return EXIT_OK
    print(runs_table(runs, [asking_column(asking)]))
    return EXIT_OK


def cmd_answer(args: argparse.Namespace) -> int:
    from laneflow.usecases.answer import answer_question

    svc = _services(args)
    note = answer_question(svc, svc.settings.tenant, args.run, args.step, args.text)
    if args.json:
        print(json.dumps(note.model_dump(mode="json"), ensure_ascii=False))
    else:
        print(f"answered step {args.step} of run {args.run}: its ask goes on with your answer")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    svc = _services(args)
    run = svc.store.get_run(svc.settings.tenant, args.run, detail=True)
    if args.follow:
        run = _follow(svc, run, quiet=args.json)
    if args.json:
        print(json.dumps(run.public(), ensure_ascii=False))
    elif not args.follow:
        print(describe(run))
    return EXIT_OK


FOLLOW_POLL_S = 0.5


def _follow(svc: Services, run: Run, *, quiet: bool) -> Run:
    """`show --follow`: the run as it stands, then each change as it happens, until the run
    ends or parks; then its lanes. With `--json`, only the final record (on stdout)."""
    from laneflow.entrypoints.cli_views import new_lines

    seen: dict[int, tuple[str, int]] = {}
    if not quiet:
        print(describe(run), flush=True)
        new_lines(run, seen)  # what is already shown
        print("following; Ctrl-C to stop following (the run goes on)", flush=True)
    try:
        while not (run.status.ended or run.status == RunStatus.awaiting_approval):
            time.sleep(FOLLOW_POLL_S)
            run = svc.store.get_run(run.tenant, run.id, detail=True)
            for line in [] if quiet else new_lines(run, seen):
                print(line, flush=True)
    except KeyboardInterrupt:
        return run
    if not quiet:
        print(summary(run).splitlines()[0], flush=True)
    return run


def cmd_estimate(args: argparse.Namespace) -> int:
    from laneflow.entrypoints.progress import plain_wanted
    from laneflow.usecases.estimate import estimate_run

    if args.output_tokens is not None and args.output_tokens < 0:
        raise InvalidInput("--output-tokens: must be 0 or more")
    svc = _services(args)
    result = estimate_run(
        svc,
        args.workspace,
        args.flow,
        parse_input(args.input),
        model=args.model,
        account=args.account,
        output_tokens=args.output_tokens,
    )
    data = result.as_dict()
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return EXIT_OK
    from rich.console import Console

    from laneflow.entrypoints.cli_views import estimate_table

    console = Console(no_color=plain_wanted(), highlight=False, soft_wrap=False)
    console.print(estimate_table(data))
    return EXIT_OK


# -- rendering -------------------------------------------------------------------------------


def summary(run: Run) -> str:
    counts: dict[str, int] = {}
    for s in run.steps:
        counts[s.status] = counts.get(s.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    tokens = sum(c.tokens.cache_read for s in run.steps for c in s.calls)
    line = f"{run.id}: {run.status} ({parts}); cost ${run.cost_usd:.4f}"
    if tokens:
        line += f"; {tokens} cache-read tokens"
    return line + f"\n  see it: laneflow show {run.id}"


# -- the parser ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with the closest name suggested for a mistyped command."""

    def error(self, message: str) -> NoReturn:
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group(2))
            close = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.5)
            if close:
                message = f"no command {match.group(1)!r}; did you mean {close[0]!r}?"
        super().error(message)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("laneflow")
    except PackageNotFoundError:  # a checkout on the path, not installed
        return "unknown (not installed)"


JSON_HELP = "print the result as JSON and nothing else on stdout"

QUIET_HELP = "no progress on stderr"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="laneflow", description="Run flows of AI-agent steps durably and cheaply.")
    parser.add_argument("--version", action="version", version=f"laneflow {_version()}", help="print laneflow's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def with_store(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--store", default=None, help="sqlite:///PATH (default sqlite:///.laneflow/laneflow.db) or dynamodb://TABLE"
        )
        return p

    def json_flag(p: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
        p.add_argument("--json", action="store_true", help=help)

    def workers_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--step-workers",
            type=int,
            default=None,
            metavar="N",
            help="run steps in N worker processes beside the engine's (default LANEFLOW_STEP_WORKERS, else one per core up to 4 on 2+ cores; 0: in this process)",
        )

    def run_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", default=None, help="run every step on this model (e.g. stub, claude-sonnet-4-6)")
        p.add_argument("--account", default=None, help="an account folder with its own AGENTS.md (kept for every attempt)")
        json_flag(p, "print the run record as JSON, nothing else on stdout")
        p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
        p.add_argument("--no-gate", action="store_true", help=argparse.SUPPRESS)  # benchmarks only: turn the warm gate off
        secrets_flag(p)
        workers_flag(p)

    def secrets_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--secrets",
            default=None,
            metavar="FILE",
            help="read agents' declared secrets from this dotenv file (default: the workspace's .secrets.env, else the environment)",
        )

    def run_id(p: argparse.ArgumentParser) -> None:
        p.add_argument("run", help="the run's id (run-...; `laneflow runs` lists them)")

    p = with_store(sub.add_parser("run", help="run a flow of a workspace"))
    p.add_argument("workspace", help="the workspace's folder")
    p.add_argument("flow", help="the flow's name (flows/NAME.yaml)")
    p.add_argument("--input", default=None, help="the run's input: JSON, or @FILE")
    run_flags(p)
    p.set_defaults(func=cmd_run, drives=True)

    p = with_store(sub.add_parser("estimate", help="what a run would cache and cost, before anything runs"))
    p.add_argument("workspace", help="the workspace's folder")
    p.add_argument("flow", help="the flow's name (flows/NAME.yaml)")
    p.add_argument("--input", default=None, help="the run's input: JSON, or @FILE")
    p.add_argument("--model", default=None, help="estimate every step on this model (e.g. claude-sonnet-4-6)")
    p.add_argument("--account", default=None, help="an account folder with its own AGENTS.md")
    p.add_argument(
        "--output-tokens",
        type=int,
        default=None,
        metavar="N",
        help="output tokens a Claude turn is assumed to write (default: what the flow's previous completed run wrote"
        f" per call of the same agent and model, else {DEFAULT_OUTPUT_TOKENS})",
    )
    json_flag(p, "print the estimate as JSON, nothing else on stdout")
    p.set_defaults(func=cmd_estimate)

    p = with_store(
        sub.add_parser(
            "demo", help="run an example flow on the stub model (newsroom, or tides: a sandboxed script with a secret)"
        )
    )
    p.add_argument(
        "example",
        nargs="?",
        default="newsroom",
        choices=["newsroom", "tides"],
        help="newsroom (default): a fan-out, a brief, a check, a post; tides: a sandboxed agent runs a script with a declared secret",
    )
    run_flags(p)
    p.add_argument(
        "--imitate", action="store_true", help="run it on Claude's executor against a local imitation of the Messages API"
    )
    p.set_defaults(func=cmd_demo, input=None, drives=True)

    p = sub.add_parser("check", help="list every problem of a workspace")
    p.add_argument("workspace", help="the workspace's folder")
    p.add_argument("--account", default=None, help="an account folder with its own AGENTS.md")
    json_flag(p, "print the problems as JSON, nothing else on stdout")
    p.set_defaults(func=cmd_check)

    p = with_store(sub.add_parser("stop", help="stop a run (one-way); from any terminal"))
    run_id(p)
    json_flag(p)
    p.set_defaults(func=cmd_stop)

    p = with_store(sub.add_parser("approve", help="answer a parked run's approval: continue it, or --reject it"))
    run_id(p)
    p.add_argument("--reject", action="store_true", help="reject: the run fails with 'rejected by a person'")
    json_flag(p, "print the run record as JSON, nothing else on stdout")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    secrets_flag(p)
    p.set_defaults(func=cmd_approve, drives=True)

    p = with_store(sub.add_parser("resume", help="re-drive a run whose drive went away (Ctrl-C, a crash), now, here"))
    run_id(p)
    json_flag(p, "print the run record as JSON, nothing else on stdout")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    secrets_flag(p)
    workers_flag(p)
    p.set_defaults(func=cmd_resume, drives=True)

    p = with_store(sub.add_parser("reconcile", help="resume or close runs whose worker went away"))
    json_flag(p, "print what was done as JSON, nothing else on stdout")
    secrets_flag(p)
    p.set_defaults(func=cmd_reconcile, drives=True)

    p = with_store(sub.add_parser("serve", help="serve the HTTP API and the run viewer on this machine"))
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="the port to listen on (default 8080)")
    p.add_argument("--workspaces", default=None, help="a folder of workspaces (default: the project's examples/)")
    secrets_flag(p)
    workers_flag(p)
    p.set_defaults(func=cmd_serve)

    p = with_store(sub.add_parser("init-store", help="create a DynamoDB store's table (and bucket) from template.yaml"))
    p.set_defaults(func=cmd_init_store)

    p = with_store(sub.add_parser("runs", help="list runs, newest first"))
    p.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    json_flag(p, "print the runs as JSON, nothing else on stdout")
    p.set_defaults(func=cmd_runs)

    p = with_store(sub.add_parser("answer", help="answer the question a step is waiting on (its ask tool)"))
    run_id(p)
    p.add_argument("step", type=int, help="the step's index (`laneflow show RUN` lists them)")
    p.add_argument("text", help="the answer, as the step will read it")
    json_flag(p)
    p.set_defaults(func=cmd_answer)

    p = with_store(sub.add_parser("show", help="show a run: its lanes, steps, durations, gate waits, cache breaks and events"))
    run_id(p)
    json_flag(p, "print the run record as JSON, nothing else on stdout")
    p.add_argument("--follow", action="store_true", help="keep printing what happens until the run ends (or parks)")
    p.set_defaults(func=cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with leaving_on_signals() if getattr(args, "drives", False) else contextlib.nullcontext():
            return int(args.func(args))
    except InvalidInput as exc:
        head, *rest = str(exc).splitlines()
        _err(head)
        for line in rest:
            print(masked(line), file=sys.stderr)
        return EXIT_INVALID
    except LaneflowError as exc:
        _err(str(exc).splitlines()[0])
        return exc.exit_code
    except KeyboardInterrupt as interrupt:  # before or after any drive: nothing of a run to leave
        _err("interrupted")
        return _exit_code(interrupt)
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
