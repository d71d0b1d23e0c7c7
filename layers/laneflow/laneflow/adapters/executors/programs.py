"""Running one of a step's programs (`run_program`) under its isolation, to its end, its time
limit, a stop or its scratch's size.

Every program gets its own process group (a stop or a time limit kills the whole group), an
environment of only PATH, HOME (the scratch copy), LANG, TZ, the LANEFLOW_RUN_ID,
LANEFLOW_STEP, LANEFLOW_AGENT and LANEFLOW_WORKSPACE variables and the step's declared secrets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from laneflow.adapters.executors.bubblewrap import bwrap_argv
from laneflow.adapters.executors.egress_proxy import Served
from laneflow.adapters.executors.isolation import BUBBLEWRAP, Isolation
from laneflow.adapters.executors.limits import Limits, child_setup
from laneflow.adapters.executors.sandbox_user import end_leftovers, hand_over, own_processes, sandbox_uid
from laneflow.adapters.executors.scratch import SCRATCH_CHECK_S, ScratchFence


@dataclass
class Finished:
    """How a program ended: its exit code (None when it was killed), what it wrote (cut at
    `keep` characters each, with their whole lengths) and why it was killed, if it was."""

    exit_code: int | None
    stdout: str
    stderr: str
    stdout_chars: int
    stderr_chars: int
    timed_out: bool = False
    stopped: bool = False
    over_scratch: bool = False  # killed: its measured scratch grew past its size


class _Reader(threading.Thread):
    """Reads a pipe to its end, keeping the first `keep` bytes-worth and counting the rest."""

    def __init__(self, pipe: IO[bytes], keep_bytes: int):
        super().__init__(daemon=True)
        self.pipe, self.keep_bytes = pipe, keep_bytes
        self.kept = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            while chunk := self.pipe.read1(65_536):  # type: ignore[attr-defined]
                self.total += len(chunk)
                room = self.keep_bytes - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
        except (OSError, ValueError):
            pass

    def text(self) -> tuple[str, int]:
        text = self.kept.decode("utf-8", errors="replace")
        extra = self.total - len(self.kept)
        return text, len(text) + max(0, extra)  # bytes past the kept part counted as characters


def _feed(pipe: IO[bytes], data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # the program did not read it all
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _watch(
    proc: subprocess.Popen[bytes], deadline: float, stopped: Callable[[], bool], fence: ScratchFence | None, poll_s: float
) -> tuple[bool, bool, bool]:
    """Wait for the program to end, killing its group at its deadline, a stop, or its measured
    scratch past its size: (timed out, stopped, over its scratch)."""
    measure_at = time.monotonic() + SCRATCH_CHECK_S
    measured = fence is not None and not fence.tmpfs
    while proc.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            _kill_group(proc)
            return True, False, False
        if stopped():
            _kill_group(proc)
            return False, True, False
        if measured and now >= measure_at:
            measure_at = now + SCRATCH_CHECK_S
            if fence is not None and fence.over():
                _kill_group(proc)
                return False, False, True
        try:
            proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
    return False, False, False


def run_program(
    argv: list[str],
    *,
    isolation: Isolation,
    scratch: Path,
    env: Mapping[str, str],
    stdin: str = "",
    timeout_s: float,
    limits: Limits,
    stopped: Callable[[], bool] = lambda: False,
    read_only: list[Path] | None = None,
    readable: list[Path] | None = None,
    fence: ScratchFence | None = None,
    keep_chars: int = 30_000,
    poll_s: float = 0.05,
    network: Served | None = None,
) -> Finished:
    """Run one program to its end, its time limit, a stop, or (a measured scratch) its
    scratch's size, whichever comes first; any of those kills its whole process group.
    `read_only`: paths in the scratch it may not change; `readable`: folders outside it that
    it reads (the @NAME secret files'). Raises OSError when it cannot start."""
    uid = sandbox_uid()
    if uid is not None:
        hand_over(scratch, uid, readable or [])
        processes = limits.processes
    else:  # RLIMIT_NPROC counts the user's own processes too
        processes = limits.processes + (own_processes(os.geteuid()) if os.geteuid() != 0 else 0)
    binds = (read_only or []) + (readable or [])
    extra: list[str] = []
    if network is not None:  # the step's egress proxy: its variables, its socket and forwarder (egress_proxy.py)
        argv, env, extra = network.wrap(argv), {**env, **network.env}, network.bwrap_args
    command = bwrap_argv(argv, scratch, binds, extra) if isolation is BUBBLEWRAP else argv
    proc = subprocess.Popen(
        command,
        cwd=str(scratch),
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: killed as one
        preexec_fn=child_setup(limits, processes),  # setrlimit and prctl only, nothing that takes a lock
        close_fds=True,
        # The uid is set before preexec_fn runs: the limits bind the sandbox's uid.
        user=uid,
        group=uid,
        extra_groups=[] if uid is not None else None,
    )
    keep_bytes = keep_chars * 4
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    readers = [_Reader(proc.stdout, keep_bytes), _Reader(proc.stderr, keep_bytes)]
    for reader in readers:
        reader.start()
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin.encode("utf-8", errors="replace")), daemon=True)
    feeder.start()
    try:
        timed_out, was_stopped, over = _watch(proc, time.monotonic() + timeout_s, stopped, fence, poll_s)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        proc.wait()
        # What is still running in its group (a child it left behind) goes too, and, with a
        # uid of its own outside bubblewrap's pid namespace, whatever left the group.
        _kill_group(proc)
        if uid is not None and isolation is not BUBBLEWRAP:
            end_leftovers(uid)
    for reader in readers:
        reader.join(timeout=2)
    code = None if (timed_out or was_stopped or over) else proc.returncode
    if fence is not None and not fence.tmpfs and code is not None:
        over = fence.over()  # it ended past it, between two measures
    (out, out_n), (err, err_n) = readers[0].text(), readers[1].text()
    return Finished(code, out, err, out_n, err_n, timed_out=timed_out, stopped=was_stopped, over_scratch=over)
