"""The `laneflow` commands that look, changing nothing: `runs`, `show`, `check`, `estimate`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from laneflow.domain.errors import InvalidInput, Problem
from laneflow.domain.records import Run, RunStatus
from laneflow.entrypoints.cli_base import EXIT_INVALID, EXIT_OK, command_services, parse_input, plural, summary
from laneflow.entrypoints.cli_tables import output_width, styled
from laneflow.entrypoints.cli_views import asking_column, describe, runs_table
from laneflow.ports import Services


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
            print(f"{args.workspace}: {plural(len(errors), 'error')}, {plural(warnings, 'warning')}", file=sys.stderr)
        else:
            print(f"{args.workspace}: ok" + (f" ({plural(warnings, 'warning')})" if warnings else ""))
    return EXIT_INVALID if errors else EXIT_OK  # a workspace with errors is bad input, as for `run`


def cmd_runs(args: argparse.Namespace) -> int:
    from laneflow.usecases.answer import waiting_questions

    svc = command_services(args)
    from laneflow.usecases.list_runs import runs_with_live_cost

    runs = runs_with_live_cost(svc, svc.settings.tenant, limit=args.limit)
    asking: dict[str, list[int]] = {}  # run id -> the steps waiting on a person's answer
    for q in waiting_questions(svc, svc.settings.tenant):
        asking.setdefault(q.run_id, []).append(q.index)
    if args.json:
        print(json.dumps([{**r.public(), "asking": asking.get(r.id, [])} for r in runs]))
        return EXIT_OK
    print(runs_table(runs, [asking_column(asking)], output_width(), bold=styled()))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    svc = command_services(args)
    run = svc.store.get_run(svc.settings.tenant, args.run, detail=True)
    if args.follow:
        run = _follow(svc, run, quiet=args.json)
    if args.json:
        print(json.dumps(run.public(), ensure_ascii=False))
    elif not args.follow:
        print(describe(run, output_width(), bold=styled()))
    return EXIT_OK


FOLLOW_POLL_S = 0.5


def _follow(svc: Services, run: Run, *, quiet: bool) -> Run:
    """`show --follow`: the run as it stands, then each change as it happens (its status,
    its steps' changes and events), until the run ends or parks. With `--json`, only the
    final record (on stdout)."""
    from laneflow.entrypoints.cli_views import new_lines

    seen: dict[int, tuple[str, int]] = {}
    status = run.status
    settled = run.status.ended or run.status == RunStatus.awaiting_approval
    if not quiet:
        print(describe(run, output_width(), bold=styled()), flush=True)
        new_lines(run, seen)  # what is already shown
        if not settled:  # (one that has ended or parked does not go on: nothing to follow)
            print("following; Ctrl-C to stop following (the run goes on)", flush=True)
        if run.status == RunStatus.queued:
            print(f"run {run.id}: queued ({_queued(run)})", flush=True)
    try:
        while not (run.status.ended or run.status == RunStatus.awaiting_approval):
            time.sleep(FOLLOW_POLL_S)
            run = svc.store.get_run(run.tenant, run.id, detail=True)
            lines = new_lines(run, seen)
            if run.status != status:
                lines.insert(0, f"run {run.id}: {run.status}" + (f" ({_queued(run)})" if run.status == RunStatus.queued else ""))
                status = run.status
            for line in [] if quiet else lines:
                print(line, flush=True)
    except KeyboardInterrupt:
        return run
    if not quiet:
        print(summary(run).splitlines()[0], flush=True)
    return run


def _queued(run: Run) -> str:
    """What a queued run waits for: a drive to take it (first, or after an approval or a crash)."""
    return "waiting for a drive" if run.driver is None else "its drive is starting"


def cmd_estimate(args: argparse.Namespace) -> int:
    from laneflow.usecases.estimate import estimate_run

    if args.output_tokens is not None and args.output_tokens < 0:
        raise InvalidInput("--output-tokens: must be 0 or more")
    svc = command_services(args)
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
    from laneflow.entrypoints.cli_views import estimate_text

    print(estimate_text(data, output_width(), bold=styled()))
    return EXIT_OK
