"""`laneflow schedule ...`: flows on a schedule, on this machine's store.

    schedule add WORKSPACE FLOW EXPRESSION [--input JSON|@FILE] [--timezone TZ]
                 [--overlap skip|allow|buffer-one] [--model M]
    schedule list                      each with its next three firings, on its zone's clock
    schedule show ID                   its record: its latest firings and the runs they started
    schedule pause ID | resume ID | remove ID
    schedule tick [--at TIME] [--catchup 1h] [--no-drive]
                                       fire once what is due at TIME (a host's own cron)

`laneflow serve` fires schedules by itself; `tick` is for a machine whose own cron calls it
(and for tests). The runs `tick` starts are driven here to their end (or their park), unless
`--no-drive` leaves them queued for whoever drives runs (`serve`, `reconcile`).

Only `register` is imported when the parser is built; the commands import what they use.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from laneflow.domain.errors import InvalidInput

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, None: 1}


def duration_s(text: str) -> float:
    """`90`, `90s`, `30m`, `1h`, `2d` as seconds; `InvalidInput` naming `--catchup`."""
    found = _DURATION.fullmatch(text.strip().lower())
    if not found:
        raise InvalidInput(f"--catchup {text!r}: give a duration such as 30m, 1h or 3600 (seconds)")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def register(sub: Any, with_store: Any) -> None:
    """The `schedule` command and its subcommands, on the CLI's parser."""
    p = sub.add_parser("schedule", help="flows on a schedule: add, list, show, pause, resume, remove, tick")
    commands = p.add_subparsers(dest="schedule_command", metavar="COMMAND", required=True, parser_class=type(p))

    def json_flag(c: argparse.ArgumentParser) -> None:
        c.add_argument("--json", action="store_true", help="print the result as JSON and nothing else on stdout")

    c = with_store(commands.add_parser("add", help="run a flow on an EventBridge schedule expression"))
    c.add_argument("workspace", help="the workspace's folder")
    c.add_argument("flow", help="the flow's name (flows/NAME.yaml)")
    c.add_argument(
        "expression", help="rate(15 minutes), cron(0 7 ? * MON-FRI *) (six fields, one day field '?'), at(2026-12-24T06:00:00)"
    )
    c.add_argument("--input", default=None, help="each run's input: JSON, or @FILE")
    c.add_argument("--timezone", default="UTC", help="the zone the expression is read in (default UTC), e.g. Europe/Berlin")
    c.add_argument(
        "--overlap",
        default="skip",
        choices=["skip", "allow", "buffer-one"],
        help="while its last run is active: skip the firing (default), buffer-one (start one after it), allow",
    )
    c.add_argument("--model", default=None, help="run every step on this model")
    json_flag(c)
    c.set_defaults(func=cmd_add)

    c = with_store(commands.add_parser("list", help="the schedules, each with its next three firings"))
    json_flag(c)
    c.set_defaults(func=cmd_list)

    c = with_store(commands.add_parser("show", help="a schedule: its latest firings and the runs they started"))
    c.add_argument("id", help="the schedule's id (sch-...)")
    json_flag(c)
    c.set_defaults(func=cmd_show)

    for name, func, said in (
        ("pause", cmd_pause, "pause a schedule: nothing fires until it is resumed"),
        ("resume", cmd_resume, "resume a paused schedule: it fires from now on (not what came while paused)"),
        ("remove", cmd_remove, "remove a schedule (the runs it started stay)"),
    ):
        c = with_store(commands.add_parser(name, help=said))
        c.add_argument("id", help="the schedule's id (sch-...)")
        json_flag(c)
        c.set_defaults(func=func)

    c = with_store(commands.add_parser("tick", help="fire, once, what is due at a time (for a host's own cron)"))
    c.add_argument("--at", default=None, metavar="TIME", help="the time to look at (ISO-8601; default now)")
    c.add_argument("--catchup", default="1h", help="fire a due firing at most this old (default 1h); older ones are missed")
    c.add_argument("--no-drive", action="store_true", help="leave the runs it starts queued (for serve or reconcile)")
    c.add_argument(
        "--step-workers", type=int, default=None, metavar="N", help="run steps in N worker processes (as `laneflow run` does)"
    )
    json_flag(c)
    c.set_defaults(func=cmd_tick, drives=True)


# -- the commands ---------------------------------------------------------------------------------


def cmd_add(args: argparse.Namespace) -> int:
    from pathlib import Path

    from laneflow.entrypoints.cli_base import EXIT_OK, command_services, parse_input
    from laneflow.usecases.schedules import AddSchedule, add_schedule

    svc = command_services(args)
    folder = Path(args.workspace).expanduser().resolve()
    if not folder.is_dir():
        raise InvalidInput(f"workspace {args.workspace}: no such folder")
    request = AddSchedule(
        workspace=folder.name,
        flow=args.flow,
        expression=args.expression,
        input=_object_input(parse_input(args.input)),
        timezone=args.timezone,
        overlap=args.overlap,
        model=args.model,
    )
    schedule = add_schedule(svc, svc.settings.tenant, request, where=str(folder))
    if args.json:
        print(json.dumps(schedule.public(), ensure_ascii=False))
        return EXIT_OK
    record = schedule.public()
    print(
        f"{schedule.id}: {schedule.workspace}/{schedule.flow} on {schedule.expression} ({schedule.timezone}), overlap {schedule.overlap}"
    )
    print("  next: " + (", ".join(record["next"]) or "never (it does not fire again)"))
    return EXIT_OK


def _object_input(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput("--input: a schedule's input is a JSON object")
    return value


def cmd_list(args: argparse.Namespace) -> int:
    from laneflow.entrypoints.cli_base import EXIT_OK, command_services

    svc = command_services(args)
    schedules = [s.public() for s in svc.store.list_schedules(svc.settings.tenant)]
    if args.json:
        print(json.dumps(schedules, ensure_ascii=False))
        return EXIT_OK
    if not schedules:
        print("no schedules (add one: laneflow schedule add WORKSPACE FLOW EXPRESSION)")
        return EXIT_OK
    for s in schedules:
        last = s["firings"][0] if s["firings"] else None
        said = f"{last['outcome']} {last['scheduled_at']}" if last else "not fired yet"
        print(
            f"{s['id']}  {s['state']:<7}  {s['workspace']}/{s['flow']}  {s['expression']}  {s['timezone']}  overlap {s['overlap']}"
        )
        print("  next: " + (", ".join(s["next"]) or "none") + f"   last: {said}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from laneflow.entrypoints.cli_base import EXIT_OK, command_services
    from laneflow.usecases.schedules import runs_of_schedule

    svc = command_services(args)
    tenant = svc.settings.tenant
    schedule = svc.store.get_schedule(tenant, args.id)
    runs = runs_of_schedule(svc, tenant, schedule.id, limit=10).runs
    if args.json:
        print(json.dumps({**schedule.public(), "runs": [r.public() for r in runs]}, ensure_ascii=False))
        return EXIT_OK
    record = schedule.public()
    print(f"schedule {schedule.id}  {schedule.state}")
    print(
        f"  flow {schedule.workspace}/{schedule.flow} on {schedule.expression} ({schedule.timezone}), overlap {schedule.overlap}"
    )
    print("  next: " + (", ".join(record["next"]) or "none"))
    print(f"  input: {json.dumps(schedule.input, ensure_ascii=False)[:200]}")
    print("firings (newest first):" if schedule.firings else "no firings yet")
    for f in schedule.firings:
        print(f"  {f.scheduled_at}  {f.outcome:<8} {f.run_id or ''}" + (f"  {f.reason}" if f.reason else ""))
    if runs:
        print("runs (newest first):")
        for r in runs:
            print(f"  {r.id}  {r.status}  {r.scheduled_at}")
    return EXIT_OK


def _changed(args: argparse.Namespace, what: str) -> int:
    from laneflow.domain.schedules import ScheduleState
    from laneflow.entrypoints.cli_base import EXIT_OK, command_services
    from laneflow.usecases.schedules import remove_schedule, set_state

    svc = command_services(args)
    tenant = svc.settings.tenant
    if what == "removed":
        schedule = remove_schedule(svc, tenant, args.id)
    else:
        schedule = set_state(svc, tenant, args.id, ScheduleState.paused if what == "paused" else ScheduleState.enabled)
    if args.json:
        print(json.dumps(schedule.public(), ensure_ascii=False))
    else:
        print(f"{schedule.id}: {what}" + (f"; next: {', '.join(schedule.public()['next'])}" if what == "resumed" else ""))
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    return _changed(args, "paused")


def cmd_resume(args: argparse.Namespace) -> int:
    return _changed(args, "resumed")


def cmd_remove(args: argparse.Namespace) -> int:
    return _changed(args, "removed")


def cmd_tick(args: argparse.Namespace) -> int:
    import datetime as dt

    from laneflow.domain.schedule_expressions import instant_of
    from laneflow.entrypoints.cli_base import EXIT_OK, command_services, err, summary
    from laneflow.usecases.fire_schedule import tick
    from laneflow.wiring import local_engine

    now = instant_of(args.at, "--at") if args.at else dt.datetime.now(dt.UTC)
    catchup = duration_s(args.catchup)
    svc = command_services(args)
    svc.drives = None  # the runs it starts are driven below, one after another (or left queued)
    fired = tick(svc, now, catchup_s=catchup, tenant=svc.settings.tenant)
    if args.json:
        print(json.dumps([f.as_dict() for f in fired], ensure_ascii=False))
    else:
        for f in fired:
            print(f.line())
        if not fired:
            print(f"nothing due at {now.isoformat(timespec='seconds')}")
    started = [f.run for f in fired if f.run is not None and not f.replayed]
    if args.no_drive or not started:
        return EXIT_OK
    engine = local_engine(svc)
    for run in started:
        engine.drive(run.tenant, run.id)
        if not args.json:
            err(summary(svc.store.get_run(run.tenant, run.id), args).splitlines()[0])
    return EXIT_OK
