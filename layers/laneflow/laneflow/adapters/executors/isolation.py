"""Where a step's programs run (bash, script tools): the strongest isolation the machine offers.

- `bubblewrap` (Debian's `bwrap`): new namespaces with `--unshare-all` (so no network), the
  system's folders read-only (the host's password hashes, sudo rules and SSH host keys
  masked), a private `/tmp`, the step's scratch copy of the workspace as
  the only writable place (its agents' definitions read-only within it), `--die-with-parent`.
- `subprocess`: a plain child process. Neither the network nor the file system is fenced;
  the trace says so, and `network_enforce: true` refuses such a step.

Either way each program gets its own process group (a stop or a time limit kills the whole
group), an environment of only PATH, HOME (the scratch copy), LANG, TZ, the LANEFLOW_RUN_ID,
LANEFLOW_STEP, LANEFLOW_AGENT and LANEFLOW_WORKSPACE variables and the step's declared
secrets, and the limits of its agent's `size:` (CPU seconds, memory, processes), set in the
child before it starts.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger("laneflow.sandbox")

BWRAP = "bwrap"

PATH = "/usr/local/bin:/usr/bin:/bin"

# System folders a program may read (never /root, /home or where laneflow itself lives).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")

# What stays hidden inside those (bubblewrap): the host's password hashes, its sudo rules and
# its SSH host keys, readable by a root-owned program otherwise.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")

MASKED_DIRS = ("/etc/ssh", "/etc/sudoers.d")

DEFAULT_SIZE = "medium"


@dataclass(frozen=True)
class Limits:
    cpu_s: int
    memory_bytes: int
    processes: int


GIB = 1024**3

# `size:` -> the limits a program runs under. The process count is the user's, machine-wide
# (RLIMIT_NPROC), so it is generous: it stops a fork bomb, not a build.
SIZES: dict[str, Limits] = {
    "small": Limits(cpu_s=60, memory_bytes=1 * GIB, processes=256),
    "medium": Limits(cpu_s=300, memory_bytes=4 * GIB, processes=1024),
    "large": Limits(cpu_s=1800, memory_bytes=16 * GIB, processes=4096),
}


def limits_for(size: str | None) -> Limits:
    return SIZES.get(size or DEFAULT_SIZE, SIZES[DEFAULT_SIZE])


@dataclass(frozen=True)
class Isolation:
    """One level of isolation: its name and whether it fences the network and files."""

    name: str  # "bubblewrap" | "subprocess"
    network_enforced: bool
    files_enforced: bool

    def describe(self) -> str:
        """The trace's line: what the step's programs got."""
        if self.network_enforced:
            return f"isolation: {self.name}, no network"
        return f"isolation: {self.name}, network not enforced, file system not enforced"


BUBBLEWRAP = Isolation("bubblewrap", network_enforced=True, files_enforced=True)

SUBPROCESS = Isolation("subprocess", network_enforced=False, files_enforced=False)


@functools.lru_cache(maxsize=1)
def _bwrap_works() -> bool:
    """Whether bubblewrap is installed and can make its namespaces here (a machine that
    refuses user namespaces fails at once)."""
    exe = shutil.which(BWRAP)
    if not exe:
        return False
    try:
        done = subprocess.run(
            [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
             "--unshare-all", "--die-with-parent", "true"],
            capture_output=True, timeout=10, env={"PATH": PATH},
        )
    except (OSError, subprocess.SubprocessError):
        return False
    if done.returncode != 0:
        log.info("bubblewrap cannot run here (%s): programs run as plain subprocesses", done.stderr.decode(errors="replace")[:200])
    return done.returncode == 0


def detect() -> Isolation:
    """The strongest isolation this machine offers (looked for once per process)."""
    return BUBBLEWRAP if _bwrap_works() else SUBPROCESS


def choose(level: str) -> Isolation | None:
    """The isolation a setting names (`LANEFLOW_ISOLATION`): None for `auto` (found when a
    step first runs a program), SUBPROCESS for `subprocess`."""
    return SUBPROCESS if level == "subprocess" else None


def bubblewrap_available() -> bool:
    return _bwrap_works()


# -- running one program ---------------------------------------------------------------------


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


def _set_limits(limits: Limits) -> Callable[[], None]:
    def apply() -> None:  # in the child, before it runs the program
        for which, value in (
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_NPROC, limits.processes),
        ):
            try:
                resource.setrlimit(which, (value, value))
            except (ValueError, OSError):
                pass  # a hard limit already lower: keep it

    return apply


def _bwrap_argv(argv: list[str], scratch: Path, read_only: list[Path]) -> list[str]:
    exe = shutil.which(BWRAP) or BWRAP
    out = [exe, "--unshare-all", "--die-with-parent", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            out += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            out += ["--ro-bind", folder, folder]
    for masked in MASKED_FILES:
        if os.path.isfile(masked):
            out += ["--ro-bind", "/dev/null", masked]
    for hidden in MASKED_DIRS:
        if os.path.isdir(hidden):
            out += ["--tmpfs", hidden]
    out += ["--bind", str(scratch), str(scratch)]
    for path in read_only:
        out += ["--ro-bind", str(path), str(path)]
    out += ["--chdir", str(scratch), "--"]
    return out + argv


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    keep_chars: int = 30_000,
    poll_s: float = 0.05,
) -> Finished:
    """Run one program to its end, its time limit, or a stop (whichever comes first); a
    limit or a stop kills its whole process group. Raises OSError when it cannot start."""
    command = _bwrap_argv(argv, scratch, read_only or []) if isolation is BUBBLEWRAP else argv
    proc = subprocess.Popen(
        command,
        cwd=str(scratch),
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: killed as one
        preexec_fn=_set_limits(limits),  # noqa: PLW1509 - only setrlimit, nothing that takes a lock
        close_fds=True,
    )
    keep_bytes = keep_chars * 4
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    readers = [_Reader(proc.stdout, keep_bytes), _Reader(proc.stderr, keep_bytes)]
    for reader in readers:
        reader.start()
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin.encode("utf-8", errors="replace")), daemon=True)
    feeder.start()
    deadline = time.monotonic() + timeout_s
    timed_out = was_stopped = False
    try:
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                timed_out = True
            elif stopped():
                was_stopped = True
            if timed_out or was_stopped:
                _kill_group(proc)
                break
            try:
                proc.wait(timeout=poll_s)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        proc.wait()
        # What is still running in its group (a child it left behind) goes too.
        _kill_group(proc)
    for reader in readers:
        reader.join(timeout=2)
    (out, out_n), (err, err_n) = readers[0].text(), readers[1].text()
    code = None if (timed_out or was_stopped) else proc.returncode
    return Finished(code, out, err, out_n, err_n, timed_out=timed_out, stopped=was_stopped)
