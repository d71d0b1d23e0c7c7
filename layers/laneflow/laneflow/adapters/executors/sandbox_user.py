"""Who a step's program is (`sandbox_uid`). When laneflow runs as root, a program never does:
it is started as an unprivileged uid of its own, SANDBOX_UID_BASE + the worker's pid (nobody's
65534 where the machine maps no such uid), which owns nothing on the host, and only then does
bubblewrap make its (unprivileged) user namespace, in which that uid shows as nobody. Mapping
the sandbox's uid to the host's 0 would not do: a process whose kernel uid is 0 passes every
permission check as the owner of root's files, capabilities or not. A uid of the step's own
rather than nobody's shared one, because RLIMIT_NPROC counts a uid's processes machine-wide
(with one uid for every sandbox, one step's fork bomb would use up every other step's
processes), and because in the plain-subprocess fallback a shared uid would open every other
step's scratch. Before each program the scratch copy and the attempt's `@NAME` secret files
are handed over to that uid (`hand_over`); laneflow, as root, still reads them to copy back
what the attempt keeps. When laneflow is not root, its programs run as its own user (under
bubblewrap still nobody in their namespace, with no capabilities)."""

from __future__ import annotations

import errno
import logging
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("laneflow.sandbox")

PATH = "/usr/local/bin:/usr/bin:/bin"

NOBODY = 65534

# A root laneflow's programs run as SANDBOX_UID_BASE + the sandbox worker's pid: above any uid
# a distribution or a container's subordinate ranges hand out, below 2^31 for every tool that
# reads a uid as a signed number, and one per live worker (pids are unique while they live).
SANDBOX_UID_BASE = 2_000_000_000


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
    """The host uid this process's programs run as (see this module's docstring): None when
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


def end_leftovers(uid: int) -> None:
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


def own_processes(uid: int) -> int:
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
