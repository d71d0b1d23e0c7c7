"""The bubblewrap (Debian's `bwrap`) fence around a step's program: whether it works here,
and the arguments that wrap one program in it."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from laneflow.adapters.executors.sandbox_user import NOBODY, PATH, sandbox_uid

log = logging.getLogger("laneflow.sandbox")

BWRAP = "bwrap"

# System folders a program may read (never /root, /home or where laneflow itself lives).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")

# What stays hidden inside those (bubblewrap): the host's password hashes, its sudo rules and
# its SSH host keys.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")

MASKED_DIRS = ("/etc/ssh", "/etc/sudoers.d")

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


@functools.lru_cache(maxsize=1)
def bwrap_works() -> bool:
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


def bwrap_argv(argv: list[str], scratch: Path, read_only: list[Path], extra: Sequence[str] = ()) -> list[str]:
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
    out += [*extra]  # the egress proxy's socket, for a step with a network: list (egress_proxy.py)
    out += ["--chdir", str(scratch), "--"]
    return out + argv
