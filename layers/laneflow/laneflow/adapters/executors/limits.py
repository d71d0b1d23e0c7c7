"""What one `size:` allows a step's programs (`Limits`), set in the child before it starts:
processes (RLIMIT_NPROC, which binds only a uid that is not root: the sandbox's own when
laneflow is root, else counted beside what laneflow's user already runs), memory and CPU
seconds (RLIMIT_AS and RLIMIT_CPU, each a process), one file's size (RLIMIT_FSIZE, at most the
scratch's size) and the scratch's size (`ScratchFence`, in scratch.py)."""

from __future__ import annotations

import ctypes
import resource
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_SIZE = "medium"

MIB = 1024**2

GIB = 1024**3

_PR_SET_NO_NEW_PRIVS = 38

_LIBC = ctypes.CDLL(None, use_errno=True)


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


def child_setup(limits: Limits, processes: int) -> Callable[[], None]:
    """What the child runs before the program (`preexec_fn`): the limits, with `processes` as
    RLIMIT_NPROC, and no new privileges."""

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
