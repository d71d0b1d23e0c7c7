"""The `laneflow` commands that act on runs without driving them here, or serve them:
`serve`, `stop`, `answer`, `init-store`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from laneflow.entrypoints.cli_base import EXIT_OK, command_services, err
from laneflow.wiring import init_store, serving


def cmd_serve(args: argparse.Namespace) -> int:
    from laneflow.entrypoints.cli_schedules import duration_s
    from laneflow.entrypoints.serve import make_server, reconcile_runs, serve
    from laneflow.paths import project_root

    catchup_s = duration_s(args.catchup)  # a bad flag is said before anything listens

    folder = Path(args.workspaces or project_root() / "examples").resolve()
    svc = serving(command_services(args), folder)
    # Listen first: a port in use (exit 2) is said before this process re-drives any run.
    server = make_server(svc, args.host, args.port, quiet=False)
    try:
        lines = reconcile_runs(svc)
    except BaseException:
        server.server_close()
        raise
    for line in lines:
        err(f"reconcile: {line}")
    err(f"workspaces in {folder}")
    serve(svc, server=server, catchup_s=catchup_s)
    return EXIT_OK


def cmd_init_store(args: argparse.Namespace) -> int:
    for line in init_store(args.store or "sqlite:///.laneflow/laneflow.db"):
        print(line)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    from laneflow.usecases.stop import stop_run

    svc = command_services(args)
    outcome = stop_run(svc, svc.settings.tenant, args.run)
    if args.json:
        print(json.dumps({"message": outcome.message, "run": outcome.run.public()}, ensure_ascii=False))
    else:
        print(outcome.message)
    return EXIT_OK


def cmd_answer(args: argparse.Namespace) -> int:
    from laneflow.usecases.answer import answer_question

    svc = command_services(args)
    note = answer_question(svc, svc.settings.tenant, args.run, args.step, args.text)
    if args.json:
        print(json.dumps(note.model_dump(mode="json"), ensure_ascii=False))
    else:
        print(f"answered step {args.step} of run {args.run}: the step waiting on it reads your answer now")
    return EXIT_OK
