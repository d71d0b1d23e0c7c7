"""What every `laneflow` command shares: its exit codes, its one line on stderr, the
services it works through, its `--input`, and what SIGINT and SIGTERM do to a command that
drives runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from laneflow.adapters.logs import masked
from laneflow.domain import jsonsafe
from laneflow.domain.errors import InvalidInput
from laneflow.domain.records import Run, RunStatus
from laneflow.ports import Services
from laneflow.settings import Settings
from laneflow.wiring import for_store, open_store

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def err(message: str) -> None:
    print(f"laneflow: {masked(message)}", file=sys.stderr)  # a bad input may quote a secret back


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached a command that drives runs: this worker is going away. A
    KeyboardInterrupt, so the engine leaves the run resumable whichever signal it was."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
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


def program(argv0: str | None = None, main_module: str | None = None) -> str:
    """This program as a shell would run it again: `laneflow` when that name on PATH is this
    very script; else the script's absolute path (`.venv/bin/laneflow` from another folder);
    `PYTHON -m MODULE` when it was run so; `laneflow` when it is called in-process (a test, a
    program importing `main`), whose argv[0] is not laneflow's."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if main_module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        main_module = spec.name if spec is not None else ""
    if main_module.split(".")[0] == "laneflow":
        return f"{_python()} -m {main_module.removesuffix('.__main__')}"
    name = Path(argv0).name
    if not name.startswith("laneflow"):
        return "laneflow"
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return name
    return shlex.quote(os.path.abspath(argv0))


def _python() -> str:
    """This interpreter: its bare name when PATH gives this very file (a venv's python is a
    link to the system's, so the path is compared, not what it links to)."""
    name = Path(sys.executable).name
    found = shutil.which(name)
    if found and os.path.abspath(found) == os.path.abspath(sys.executable):
        return name
    return shlex.quote(sys.executable)


def hint(args: argparse.Namespace | None, *words: str) -> str:
    """A command to print for a person to run next, that works as printed: this program as it
    was invoked, the words, and the `--store` this command was given."""
    store = getattr(args, "store", None)
    return " ".join([program(), *(shlex.quote(w) for w in words), *(["--store", shlex.quote(store)] if store else [])])


def went_away(
    svc: Services, tenant: str, run_id: str, interrupt: KeyboardInterrupt, args: argparse.Namespace | None = None
) -> int:
    """What a person is told when SIGINT or SIGTERM ended a drive: where the run stands and
    how to go on."""
    run = svc.store.get_run(tenant, run_id, steps=False)
    if run.status.ended:
        err(f"interrupted; run {run_id} had already ended ({run.status}): {hint(args, 'show', run_id)}")
    elif run.status == RunStatus.awaiting_approval:
        err(f"interrupted; run {run_id} is waiting for a person: {hint(args, 'approve', run_id)} (or --reject)")
    else:
        err(
            f"interrupted; run {run_id} is resumable: {hint(args, 'resume', run_id)} "
            f"(or {hint(args, 'reconcile')}; {hint(args, 'stop', run_id)} to end it)"
        )
    return exit_code(interrupt)


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


def command_services(args: argparse.Namespace, settings: Settings | None = None) -> Services:
    """The services a command works through: the store `--store` names, the settings of the
    environment (or `settings`) with the command's own flags over them."""
    from laneflow.settings import settings as from_env

    cfg = settings or from_env()  # first: a bad LANEFLOW_TENANT is refused before a store is made
    if getattr(args, "secrets", None):
        cfg = cfg.model_copy(update={"secrets_file": secrets_file(args.secrets)})
    if getattr(args, "drives", False) or getattr(args, "serves", False):
        cfg = cfg.model_copy(update={"step_workers": step_workers(getattr(args, "step_workers", None), cfg)})
    return for_store(open_store(args.store), cfg)


MAX_DEFAULT_STEP_WORKERS = 4  # what a drive starts unless told: each is a Python of its own with laneflow imported

# A run of fewer steps than this runs them in the engine's process unless told otherwise. A
# worker takes ~0.3 s of CPU to start and saves ~3 ms of the engine's a step
# (bench/local_engine.py): a one-step stub run took 0.99 s of CPU with none, 1.25 s with one
# and 1.57 s with two, for the same wall time with one and 0.17 s more with two (bench/startup.py).
STEPS_FOR_WORKERS = 20


def step_workers(given: int | None, cfg: Settings, run: Run | None = None) -> int:
    """How many step worker processes a command that drives runs gives the embedded engine:
    `--step-workers N`, else LANEFLOW_STEP_WORKERS (read into `cfg`), else one per core up
    to four on a machine of two cores or more, none on one core. A stub run's steps all go
    to one of them (its pretend cache is the process's); a Claude lane's released siblings
    spread over all of them, so on two cores two workers start a lane of 100 about a quarter
    sooner than one (docs/CHOICES.md, "Step workers"). For a drive of `run`, that default is
    none for a run of fewer than STEPS_FOR_WORKERS steps, and one for a run all on the stub."""
    if given is not None:
        if not 0 <= given <= 32:
            raise InvalidInput(f"--step-workers {given}: give 0 (every step in this process) to 32")
        return given
    if cfg.step_workers_given:
        return cfg.step_workers
    cores = os.cpu_count() or 1
    size = min(cores, MAX_DEFAULT_STEP_WORKERS) if cores >= 2 else 0
    if run is not None and len(run.steps) < STEPS_FOR_WORKERS:
        return 0
    if run is not None and all(step.model == "stub" for step in run.steps):
        return min(size, 1)  # the others would never get a call
    return size


def secrets_file(given: str) -> str:
    """`--secrets FILE`: the dotenv file declared secrets are read from, as an absolute path
    (the settings carry it to every step this process runs, and to the sandbox workers it
    starts, which are given the engine's settings). A file that is not there is bad input,
    said before anything runs."""
    path = Path(given).expanduser().resolve()
    if not path.is_file():
        raise InvalidInput(f"--secrets {given}: no such file")
    return str(path)


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 attempt`, `2 attempts`; `many` where adding an s is wrong (`1 prefix`, `3 prefixes`)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def summary(run: Run, args: argparse.Namespace | None = None) -> str:
    """The run's one line (its status, its steps by status, its cost), then how to see it."""
    counts: dict[str, int] = {}
    for s in run.steps:
        counts[s.status] = counts.get(s.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    tokens = sum(c.tokens.cache_read for s in run.steps for c in s.calls)
    line = f"{run.id}: {run.status} ({parts}); cost ${run.cost_usd:.4f}"
    if tokens:
        line += f"; {plural(tokens, 'cache-read token')}"
    return line + f"\n  see it: {hint(args, 'show', run.id)}"
