"""The scratch's size (`ScratchFence`): a tmpfs of that size where the sandbox worker could
mount one in a mount namespace of its own (`private_scratch`, as root), else measured while
each program runs and killed past it."""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from laneflow.adapters.executors.limits import LARGEST_SCRATCH, amount

log = logging.getLogger("laneflow.sandbox")

# How often a measured scratch is measured while a program runs (what it can overshoot by is
# what it writes in that time).
SCRATCH_CHECK_S = 0.5

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
