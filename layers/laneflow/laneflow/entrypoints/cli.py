"""`laneflow`: run flows locally on the embedded engine and store, and inspect them.

Exit codes: 0 a completed run (or a clean check), 1 a failed run (or a check with errors),
2 bad input (workspace, flow, run input, flags), with one clear line on stderr; 130 and 143
when SIGINT (Ctrl-C) or SIGTERM ended a command that drives a run (the run stays resumable).
`--json` prints the record as JSON and nothing else on stdout; progress goes to stderr.

This module is the parser and `main` (the console script); the commands are in
cli_drive (those that drive runs here), cli_inspect (those that look), cli_control
(serve, stop, answer, init-store) and cli_examples (init, examples), over what they share
(cli_base). A command's module is imported when that command runs (`_command`): `laneflow
show` loads what showing a run needs, not the engine, the model SDKs or the MCP client.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import gc
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from laneflow.adapters.logs import masked
from laneflow.domain.errors import InvalidInput, LaneflowError
from laneflow.domain.estimate import DEFAULT_OUTPUT_TOKENS
from laneflow.entrypoints.cli_base import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    Interrupted,
    err,
    exit_code,
    leaving_on_signals,
    parse_input,
    step_workers,
    summary,
)

__all__ = [  # what other modules and the tests take from here
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_OK",
    "Interrupted",
    "build_parser",
    "leaving_on_signals",
    "main",
    "parse_input",
    "step_workers",
    "summary",
]

Command = Callable[[argparse.Namespace], int]


def _command(module: str, name: str) -> Command:
    """The command `name` of `laneflow.entrypoints.<module>`, imported when it runs."""

    def run(args: argparse.Namespace) -> int:
        command: Command = getattr(importlib.import_module(f"laneflow.entrypoints.{module}"), name)
        return int(command(args))

    run.__name__ = run.__qualname__ = name
    return run


class _Parser(argparse.ArgumentParser):
    """argparse, with the closest name suggested for a mistyped command or choice."""

    def error(self, message: str) -> NoReturn:
        match = re.search(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            choices = re.findall(r"'([^']*)'", match.group(3))
            close = difflib.get_close_matches(match.group(2), choices, n=1, cutoff=0.5)
            what = "command" if match.group(1) == "COMMAND" else match.group(1)
            if close:
                message = f"no {what} {match.group(2)!r}; did you mean {close[0]!r}?"
        super().error(message)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; one this command does not take is refused by the command's own parser
    (its usage, exit 2), naming the closest flag it does take."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    command = _subcommand(parser, args)
    flags = [flag for action in command._actions for flag in action.option_strings]
    for word in extra:
        if word.startswith("-"):
            given = word.split("=", 1)[0]
            close = difflib.get_close_matches(given, flags, n=1, cutoff=0.5)
            if close:
                command.error(f"no flag {given!r}; did you mean {close[0]!r}?")
    command.error(f"unrecognized arguments: {' '.join(extra)}")


def _subcommand(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)command parser `args` went through (`laneflow examples copy`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _subcommand(action.choices[chosen], args)
    return parser


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
            help="run steps in N worker processes beside the engine's (default LANEFLOW_STEP_WORKERS, else one per core up to 4 on 2+ cores, one for a run all on the stub, none for a run of under 20 steps; 0: in this process)",
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
    p.set_defaults(func=_command("cli_drive", "cmd_run"), drives=True)

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
    p.set_defaults(func=_command("cli_inspect", "cmd_estimate"))

    p = with_store(
        sub.add_parser(
            "demo",
            help="run an example flow on the stub model (newsroom; tides: a sandboxed script with a secret;"
            " almanac: delegation, an MCP server and search)",
        )
    )
    p.add_argument(
        "example",
        nargs="?",
        default="newsroom",
        choices=["newsroom", "tides", "almanac"],
        help="newsroom (default): a fan-out, a brief, a check, a post; tides: a sandboxed agent runs a script with a declared"
        " secret; almanac: an editor delegates to a researcher who searches the knowledge and asks an MCP server",
    )
    run_flags(p)
    p.add_argument(
        "--imitate", action="store_true", help="run it on Claude's executor against a local imitation of the Messages API"
    )
    p.set_defaults(func=_command("cli_drive", "cmd_demo"), input=None, drives=True)

    p = sub.add_parser("check", help="list every problem of a workspace")
    p.add_argument("workspace", help="the workspace's folder")
    p.add_argument("--account", default=None, help="an account folder with its own AGENTS.md")
    json_flag(p, "print the problems as JSON, nothing else on stdout")
    p.set_defaults(func=_command("cli_inspect", "cmd_check"))

    p = with_store(sub.add_parser("stop", help="stop a run (one-way); from any terminal"))
    run_id(p)
    json_flag(p)
    p.set_defaults(func=_command("cli_control", "cmd_stop"))

    p = with_store(sub.add_parser("approve", help="answer a parked run's approval: continue it, or --reject it"))
    run_id(p)
    p.add_argument("--reject", action="store_true", help="reject: the run fails with 'rejected by a person'")
    json_flag(p, "print the run record as JSON, nothing else on stdout")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    secrets_flag(p)
    p.set_defaults(func=_command("cli_drive", "cmd_approve"), drives=True)

    p = with_store(sub.add_parser("resume", help="re-drive a run whose drive went away (Ctrl-C, a crash), now, here"))
    run_id(p)
    json_flag(p, "print the run record as JSON, nothing else on stdout")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    secrets_flag(p)
    workers_flag(p)
    p.set_defaults(func=_command("cli_drive", "cmd_resume"), drives=True)

    p = with_store(
        sub.add_parser("redrive", help="send a failed run on from where it failed: its failed and skipped steps run again")
    )
    run_id(p)
    json_flag(p, "print the run record as JSON, nothing else on stdout")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    secrets_flag(p)
    workers_flag(p)
    p.set_defaults(func=_command("cli_drive", "cmd_redrive"), drives=True)

    p = with_store(sub.add_parser("reconcile", help="resume or close runs whose worker went away"))
    json_flag(p, "print what was done as JSON, nothing else on stdout")
    secrets_flag(p)
    p.set_defaults(func=_command("cli_drive", "cmd_reconcile"), drives=True)

    p = with_store(sub.add_parser("serve", help="serve the HTTP API and the run viewer on this machine"))
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="the port to listen on (default 8080)")
    p.add_argument("--workspaces", default=None, help="a folder of workspaces (default: the project's examples/)")
    p.add_argument(
        "--catchup",
        default="1h",
        help="back after being down, fire each schedule's last missed firing at most this old (default 1h)",
    )
    secrets_flag(p)
    workers_flag(p)
    p.set_defaults(func=_command("cli_control", "cmd_serve"), serves=True)

    p = with_store(sub.add_parser("init-store", help="create a DynamoDB store's table (and bucket) from template.yaml"))
    p.set_defaults(func=_command("cli_control", "cmd_init_store"))

    p = with_store(sub.add_parser("runs", help="list runs, newest first"))
    p.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    json_flag(p, "print the runs as JSON, nothing else on stdout")
    p.set_defaults(func=_command("cli_inspect", "cmd_runs"))

    p = with_store(sub.add_parser("answer", help="answer the question a step is waiting on (its ask tool)"))
    run_id(p)
    p.add_argument("step", type=int, help="the step's index (`laneflow show RUN` lists them)")
    p.add_argument("text", help="the answer, as the step will read it")
    json_flag(p)
    p.set_defaults(func=_command("cli_control", "cmd_answer"))

    p = with_store(sub.add_parser("show", help="show a run: its lanes, steps, durations, gate waits, cache breaks and events"))
    run_id(p)
    json_flag(p, "print the run record as JSON, nothing else on stdout")
    p.add_argument("--follow", action="store_true", help="keep printing what happens until the run ends (or parks)")
    p.set_defaults(func=_command("cli_inspect", "cmd_show"))

    _workspace_makers(sub)
    from laneflow.entrypoints.cli_schedules import register as schedule_commands  # its commands import what they use

    schedule_commands(sub, with_store)
    return parser


def _workspace_makers(sub: argparse._SubParsersAction[_Parser]) -> None:
    """`init` and `examples`: a workspace to start from."""
    p = sub.add_parser("init", help="make a workspace to start from: agents, a fan-out, an approval and an ask flow")
    p.add_argument("folder", nargs="?", default=".", help="where (default: this folder); must be new or empty")
    p.set_defaults(func=_command("cli_examples", "cmd_init"))

    p = sub.add_parser("examples", help="list the example workspaces laneflow comes with; `examples copy NAME` copies one")
    p.add_argument("--json", action="store_true", help="print the examples as JSON, nothing else on stdout")
    p.set_defaults(func=_command("cli_examples", "cmd_examples"))
    copy = p.add_subparsers(dest="examples_command", metavar="COMMAND", parser_class=_Parser)
    c = copy.add_parser("copy", help="copy an example workspace out, to run and change")
    c.add_argument("name", help="the example's name (`laneflow examples` lists them)")
    c.add_argument("folder", nargs="?", default=None, help="where (default: a new folder named after it); must be new or empty")


def main(argv: Sequence[str] | None = None) -> int:
    """The command `argv` names (None: this program's own arguments), and its exit code."""
    code = _run(_parse(build_parser(), argv))
    if argv is None:  # the program's own command: the process ends now
        # Nothing it made need be collected on the way out: after a drive, the collector's
        # passes over moto's and pydantic's objects at exit took ~0.3 s of CPU.
        gc.freeze()
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        with leaving_on_signals() if getattr(args, "drives", False) else contextlib.nullcontext():
            return int(args.func(args))
    except InvalidInput as exc:
        head, *rest = str(exc).splitlines()
        err(head)
        for line in rest:
            print(masked(line), file=sys.stderr)
        return EXIT_INVALID
    except LaneflowError as exc:
        err(str(exc).splitlines()[0])
        return exc.exit_code
    except KeyboardInterrupt as interrupt:  # before or after any drive: nothing of a run to leave
        err("interrupted")
        return exit_code(interrupt)
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
