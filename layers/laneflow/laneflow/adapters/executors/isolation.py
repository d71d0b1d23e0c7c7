"""Where a step's programs run (bash, script tools): the strongest isolation the machine offers,
behind a fence that holds when laneflow itself runs as root.

- `bubblewrap` (Debian's `bwrap`): new namespaces with `--unshare-all` (so no network), its
  own user namespace in which the program is nobody (65534) with every capability dropped
  (`--cap-drop ALL`) and no user namespace of its own to make (`--disable-userns`), so it can
  mount, remount or unmount nothing; a new session (`--new-session`: it cannot push input
  into laneflow's terminal) and `--die-with-parent`. The system's folders are read-only (the
  host's password hashes, sudo rules and SSH host keys masked), `/tmp` is private, and the
  step's scratch copy of the workspace is the only writable place (its agents' definitions
  read-only within it).
- `subprocess`: a plain child process. Neither the network nor the file system is fenced;
  the trace says so, and `network_enforce: true` refuses such a step.

Who a program is (`sandbox_uid`). When laneflow runs as root, a program never does: it is
started as an unprivileged uid of its own, SANDBOX_UID_BASE + the worker's pid (nobody's
65534 where the machine maps no such uid), which owns nothing on the host, and only then
does bubblewrap make its (unprivileged) user namespace, in which that uid shows as nobody.
Mapping the sandbox's uid to the host's 0 would not do: a process whose kernel uid is 0
passes every permission check as the owner of root's files, capabilities or not. A uid of
the step's own rather than nobody's shared one, because RLIMIT_NPROC counts a uid's
processes machine-wide (with one uid for every sandbox, one step's fork bomb would use up
every other step's processes), and because in the plain-subprocess fallback a shared uid
would open every other step's scratch. Before each program the scratch copy and the
attempt's `@NAME` secret files are handed over to that uid (`hand_over`); laneflow, as root,
still reads them to copy back what the attempt keeps. When laneflow is not root, its programs
run as its own user (under bubblewrap still nobody in their namespace, with no capabilities).

Limits (`size:` -> `Limits`), set in the child before it starts: processes (RLIMIT_NPROC,
which binds only a uid that is not root: the sandbox's own when laneflow is root, else
counted beside what laneflow's user already runs), memory and CPU seconds (RLIMIT_AS and
RLIMIT_CPU, each a process), one file's size (RLIMIT_FSIZE, at most the scratch's size) and
the scratch's size (`ScratchFence`): a tmpfs of that size where the sandbox worker could
mount one in a mount namespace of its own (`private_scratch`, as root), else measured while
each program runs and killed past it.

Every program gets its own process group (a stop or a time limit kills the whole group), an
environment of only PATH, HOME (the scratch copy), LANG, TZ, the LANEFLOW_RUN_ID,
LANEFLOW_STEP, LANEFLOW_AGENT and LANEFLOW_WORKSPACE variables and the step's declared secrets.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger("laneflow.sandbox")

BWRAP = "bwrap"

PATH = "/usr/local/bin:/usr/bin:/bin"

# System folders a program may read (never /root, /home or where laneflow itself lives).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")

# What stays hidden inside those (bubblewrap): the host's password hashes, its sudo rules and
# its SSH host keys.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")

MASKED_DIRS = ("/etc/ssh", "/etc/sudoers.d")

DEFAULT_SIZE = "medium"

NOBODY = 65534

# A root laneflow's programs run as SANDBOX_UID_BASE + the sandbox worker's pid: above any uid
# a distribution or a container's subordinate ranges hand out, below 2^31 for every tool that
# reads a uid as a signed number, and one per live worker (pids are unique while they live).
SANDBOX_UID_BASE = 2_000_000_000

MIB = 1024**2

GIB = 1024**3

# How often a measured scratch is measured while a program runs (what it can overshoot by is
# what it writes in that time).
SCRATCH_CHECK_S = 0.5


def amount(n: int) -> str:
    """A size as the trace says it: whole GiB, else MiB."""
    return f"{n // GIB} GiB" if n % GIB == 0 else f"{n // MIB} MiB"


@dataclass(frozen=True)
class Limits:
    """What one `size:` allows a step's programs: CPU seconds and memory (each a process),
    processes (the step's, together), and its scratch's size (one file is at most that)."""

    cpu_s: int
    memory_bytes: int
    processes: int
    scratch_bytes: int

    @property
    def file_bytes(self) -> int:
        return self.scratch_bytes

    def describe(self) -> str:
        return (
            f"{self.processes:,} processes, {amount(self.memory_bytes)} of memory and {self.cpu_s} s of CPU a process, "
            f"{amount(self.file_bytes)} a file"
        )

    def as_data(self) -> dict[str, int]:
        return {
            "processes": self.processes,
            "memory_bytes": self.memory_bytes,
            "cpu_s": self.cpu_s,
            "file_bytes": self.file_bytes,
            "scratch_bytes": self.scratch_bytes,
        }


SIZES: dict[str, Limits] = {
    "small": Limits(cpu_s=60, memory_bytes=512 * MIB, processes=64, scratch_bytes=1 * GIB),
    "medium": Limits(cpu_s=300, memory_bytes=2 * GIB, processes=256, scratch_bytes=4 * GIB),
    "large": Limits(cpu_s=1800, memory_bytes=8 * GIB, processes=1024, scratch_bytes=16 * GIB),
}

LARGEST_SCRATCH = max(limits.scratch_bytes for limits in SIZES.values())


def limits_for(size: str | None) -> Limits:
    return SIZES.get(size or DEFAULT_SIZE, SIZES[DEFAULT_SIZE])


# -- who a program is ----------------------------------------------------------------------------


def _mapped(uid: int, table: str = "/proc/self/uid_map") -> bool:
    """Whether this process's user namespace maps `uid` (a container may map only a range)."""
    try:
        rows = Path(table).read_text().splitlines()
    except OSError:
        return True  # no user namespaces here: every uid exists
    for row in rows:
        inside, _outside, count = (int(x) for x in row.split())
        if inside <= uid < inside + count:
            return True
    return False


def sandbox_uid() -> int | None:
    """The host uid this process's programs run as (see the module docstring): None when
    laneflow is not root, and its programs run as its own user."""
    if os.geteuid() != 0:
        return None
    for uid in (SANDBOX_UID_BASE + os.getpid(), NOBODY):
        if _mapped(uid) and _mapped(uid, "/proc/self/gid_map"):
            return uid
    return None  # a container that maps root alone: its programs stay root (the trace says so)


def _passable(folder: Path) -> None:
    """Let the sandbox's uid pass through the folders above the scratch (x, never r: it can
    reach the scratch, not list what is beside it). Only folders under the temp folder (where
    scratch copies are made) are changed; any other that bars the way is an error that names it."""
    temp = Path(tempfile.gettempdir()).resolve()
    for above in folder.resolve().parents:
        mode = os.stat(above).st_mode
        if mode & stat.S_IXOTH:
            continue
        if above == temp or temp in above.parents:
            os.chmod(above, stat.S_IMODE(mode) | stat.S_IXOTH)
        else:
            raise PermissionError(errno.EACCES, f"the sandbox's user cannot pass through {above} to reach the scratch {folder}")


def _own_tree(top: Path, uid: int) -> None:
    """Every entry under `top` (and `top`) owned by `uid`, never following a link: walked by
    open folders (`os.fwalk`), so a link swapped in for a folder is chowned as a link."""
    info = os.lstat(top)
    if stat.S_ISLNK(info.st_mode):
        return
    if (info.st_uid, info.st_gid) != (uid, uid):
        os.chown(top, uid, uid, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        return
    for _where, folders, files, dir_fd in os.fwalk(top):
        for name in folders + files:
            try:
                entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if (entry.st_uid, entry.st_gid) != (uid, uid):
                    os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass


def hand_over(scratch: Path, uid: int, also: Iterable[Path] = ()) -> None:
    """Make the scratch the program's uid's to write: everything in it owned by `uid`, its top
    0700 (no other sandbox's uid enters it), the folders above it passable; `also` (the
    attempt's @NAME secret folders) owned by it too, so it can read them."""
    _own_tree(scratch, uid)
    os.chmod(scratch, 0o700)
    _passable(scratch)
    for folder in also:
        _own_tree(folder, uid)
        _passable(folder)


def _end_leftovers(uid: int) -> None:
    """Kill whatever a program running as its own `uid` left behind outside its process group
    (a plain subprocess may start a new session): `kill -1` as that uid reaches every process
    of it and nothing else. Never for nobody's shared uid."""
    if uid == NOBODY:
        return
    try:
        subprocess.run(
            ["kill", "-KILL", "-1"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={"PATH": PATH},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        log.warning("could not end what uid %s left running", uid)


def _own_processes(uid: int) -> int:
    """The tasks (processes and threads) `uid` runs now, which RLIMIT_NPROC counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                count += int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[17])
        except (OSError, IndexError, ValueError):
            pass
    return count


# -- the scratch's size --------------------------------------------------------------------------

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x20, 0x4000, 0x40000
_PR_SET_NO_NEW_PRIVS = 38

_LIBC = ctypes.CDLL(None, use_errno=True)

_private_scratch: Path | None = None  # the tmpfs `private_scratch` mounted, in this process's own mount namespace


def private_scratch(folder: Path) -> bool:
    """In a sandbox worker, before it starts any thread: a mount namespace of its own (so
    nothing mounted here reaches the host, and all of it goes when the worker ends) and a
    tmpfs over `folder`, where its attempts' scratch copies are made; `ScratchFence` sizes it
    to the step's `size:`. Only root can; False where it cannot (the scratch is measured)."""
    global _private_scratch
    if os.geteuid() != 0 or _private_scratch is not None:
        return _private_scratch is not None
    if _LIBC.unshare(_CLONE_NEWNS) != 0:
        log.info("no mount namespace of its own (%s): the scratch is measured", os.strerror(ctypes.get_errno()))
        return False
    if _LIBC.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={LARGEST_SCRATCH},mode=0711".encode()
    if _LIBC.mount(b"laneflow-scratch", str(folder).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        log.info("no tmpfs for the scratch (%s): it is measured", os.strerror(ctypes.get_errno()))
        return False
    _private_scratch = folder
    return True


def _used_bytes(top: Path) -> int:
    """What the files under `top` take on disk (never following a link)."""
    used = 0
    for _where, _folders, files, dir_fd in os.fwalk(top):
        for name in files:
            try:
                used += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                pass
    return used


@dataclass
class ScratchFence:
    """How the scratch's size binds: a tmpfs of that size (a write past it fails, ENOSPC), or
    measured every SCRATCH_CHECK_S while a program runs, and after (past it, it is killed)."""

    root: Path
    limit_bytes: int
    tmpfs: bool

    @classmethod
    def bind(cls, root: Path, limit_bytes: int) -> ScratchFence:
        """The fence of the scratch at `root`: its tmpfs sized to `limit_bytes` when it lies on
        the worker's own (OSError when the copy is already larger), else measured."""
        own = _private_scratch
        if own is not None and (root == own or own in root.parents):
            if (
                _LIBC.mount(
                    b"laneflow-scratch",
                    str(own).encode(),
                    None,
                    _MS_REMOUNT | _MS_NOSUID | _MS_NODEV,
                    f"size={limit_bytes},mode=0711".encode(),
                )
                != 0
            ):
                code = ctypes.get_errno()
                raise OSError(
                    code,
                    f"the scratch cannot be held to {amount(limit_bytes)} ({os.strerror(code)}): the workspace's copy is larger",
                )
            return cls(root, limit_bytes, tmpfs=True)
        return cls(root, limit_bytes, tmpfs=False)

    def describe(self) -> str:
        return f"a {amount(self.limit_bytes)} scratch ({'tmpfs' if self.tmpfs else 'measured'})"

    def over(self) -> bool:
        """Whether a measured scratch holds more than its size (a tmpfs never does)."""
        return not self.tmpfs and _used_bytes(self.root) > self.limit_bytes


# -- the isolation levels ------------------------------------------------------------------------


@dataclass(frozen=True)
class Isolation:
    """One level of isolation: its name and whether it fences the network and files."""

    name: str  # "bubblewrap" | "subprocess"
    network_enforced: bool
    files_enforced: bool

    def describe(self, limits: Limits | None = None, scratch: ScratchFence | None = None) -> str:
        """The trace's line: what the step's programs got (who they run as, and the limits
        that bind them, when given)."""
        if self.network_enforced:
            line = f"isolation: {self.name}, no network"
        else:
            line = f"isolation: {self.name}, network not enforced, file system not enforced"
        if limits is None:
            return line
        uid = sandbox_uid()
        if self.name == "bubblewrap":
            host = f"uid {uid}" if uid is not None else ("root" if os.geteuid() == 0 else f"laneflow's own uid {os.geteuid()}")
            line += f"; as nobody in its own user namespace ({host} on the host), no capabilities, no mounts"
        else:
            line += (
                f"; as uid {uid}"
                if uid is not None
                else ("; as root" if os.geteuid() == 0 else f"; as laneflow's own uid {os.geteuid()}")
            )
        line += f"; limits: {limits.describe()}"
        if uid is None and os.geteuid() != 0:
            line = line.replace(f"{limits.processes:,} processes", f"{limits.processes:,} processes beside laneflow's own")
        elif uid is None:
            line = line.replace(f"{limits.processes:,} processes, ", "")  # root's processes are not counted
        if scratch is not None:
            line += f", {scratch.describe()}"
        return line


BUBBLEWRAP = Isolation("bubblewrap", network_enforced=True, files_enforced=True)

SUBPROCESS = Isolation("subprocess", network_enforced=False, files_enforced=False)


@functools.lru_cache(maxsize=1)
def _bwrap_works() -> bool:
    """Whether bubblewrap is installed and can make its namespaces here, started the way the
    programs are (a machine that refuses unprivileged user namespaces fails at once)."""
    exe = shutil.which(BWRAP)
    if not exe:
        return False
    uid = sandbox_uid()
    try:
        done = subprocess.run(
            [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *_FENCE, "true"],
            capture_output=True,
            timeout=10,
            env={"PATH": PATH},
            cwd="/",
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,  # as the programs will run
        )
    except (OSError, subprocess.SubprocessError):
        return False
    if done.returncode != 0:
        log.info(
            "bubblewrap cannot run here (%s): programs run as plain subprocesses", done.stderr.decode(errors="replace")[:200]
        )
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


def _child_setup(limits: Limits, processes: int) -> Callable[[], None]:
    def apply() -> None:  # in the child (already the sandbox's uid, when it has one), before it runs the program
        for which, value in (
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_NPROC, processes),
            (resource.RLIMIT_FSIZE, limits.file_bytes),
        ):
            try:
                resource.setrlimit(which, (value, value))
            except (ValueError, OSError):
                pass  # a hard limit already lower: keep it
        _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no set-uid program makes it root again

    return apply


# The fence itself: its own user namespace, in which it is nobody with no capability and can
# make no other (so it can mount, remount or unmount nothing), a new session, and its end when
# its parent ends.
_FENCE = (
    "--unshare-all",
    "--unshare-user",
    "--uid",
    str(NOBODY),
    "--gid",
    str(NOBODY),
    "--disable-userns",
    "--cap-drop",
    "ALL",
    "--new-session",
    "--die-with-parent",
)


def _bwrap_argv(argv: list[str], scratch: Path, read_only: list[Path]) -> list[str]:
    exe = shutil.which(BWRAP) or BWRAP
    out = [exe, *_FENCE, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
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
        processes = limits.processes + (_own_processes(os.geteuid()) if os.geteuid() != 0 else 0)
    binds = (read_only or []) + (readable or [])
    command = _bwrap_argv(argv, scratch, binds) if isolation is BUBBLEWRAP else argv
    proc = subprocess.Popen(
        command,
        cwd=str(scratch),
        env=dict(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: killed as one
        preexec_fn=_child_setup(limits, processes),  # setrlimit and prctl only, nothing that takes a lock
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
            _end_leftovers(uid)
    for reader in readers:
        reader.join(timeout=2)
    code = None if (timed_out or was_stopped or over) else proc.returncode
    if fence is not None and not fence.tmpfs and code is not None:
        over = fence.over()  # it ended past it, between two measures
    (out, out_n), (err, err_n) = readers[0].text(), readers[1].text()
    return Finished(code, out, err, out_n, err_n, timed_out=timed_out, stopped=was_stopped, over_scratch=over)
