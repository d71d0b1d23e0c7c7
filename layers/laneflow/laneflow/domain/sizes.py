"""A sandboxed step's `size:` (small, medium, large) and how it grows when memory runs out.

An attempt whose programs were killed for memory (or whose sandbox task was stopped for
memory, or evicted from its host) ends with the kind `FailureKind.memory`. The next attempt
runs one size up: an attempt's size is the agent's `size:` stepped up once for every earlier
attempt of the step's pass that ended so (`attempt_size`), so a new worker (a Fargate task
started after the last one died) finds the same size from the stored attempts as the worker
that retries in place. `large` has no size above it: a memory kill there fails the attempt
for good (`memory_failure`).

What each size is in the cloud (`TASK_RESOURCES`): the Fargate task's CPU units and MiB of
memory that the state machine's RunTask asks for. Each holds its programs' memory (the
limits.py figure a process) with room for the sandbox worker itself (~200 MiB), and is one
of Fargate's valid cpu/memory pairs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from laneflow.domain.errors import StepFailed
from laneflow.domain.records import FailureKind

ORDER = ("small", "medium", "large")

DEFAULT_SIZE = "medium"

# size -> (task CPU units, task memory in MiB)
TASK_RESOURCES: dict[str, tuple[int, int]] = {
    "small": (512, 1024),  # 512 MiB a program
    "medium": (1024, 4096),  # 2 GiB a program
    "large": (4096, 16384),  # 8 GiB a program
}


# The run option naming each sandboxed agent's `size:` (fixed as the run starts, as the
# agents it sandboxes are), for the planner to size their tasks without reading agents.
SIZES_OPTION = "sizes"


def task_overrides(size: str | None) -> dict[str, str]:
    """RunTask's task-level `cpu` and `memory` overrides of a sandbox task for `size:`."""
    cpu, memory = TASK_RESOURCES.get(size or DEFAULT_SIZE, TASK_RESOURCES[DEFAULT_SIZE])
    return {"cpu": str(cpu), "memory": str(memory)}


def run_sizes(options: dict[str, object]) -> dict[str, str]:
    """The `size:` of each sandboxed agent of a run, as its start recorded them."""
    sizes = options.get(SIZES_OPTION)
    return {str(k): str(v) for k, v in sizes.items()} if isinstance(sizes, dict) else {}


def larger(a: str, b: str) -> str:
    return a if ORDER.index(a) >= ORDER.index(b) else b


def one_up(size: str | None) -> str | None:
    """The size above `size` (the default's when it names none), None above `large`."""
    at = ORDER.index(size) if size in ORDER else ORDER.index(DEFAULT_SIZE)
    return ORDER[at + 1] if at + 1 < len(ORDER) else None


@dataclass(frozen=True)
class AttemptSize:
    """The size an attempt runs at, and the size it was stepped up from (None: its agent's own)."""

    size: str
    up_from: str | None = None
    why: str = "out of memory"  # or "evicted": what ended the attempt that stepped it up

    def line(self) -> str:
        """The step's trace line for a stepped-up attempt."""
        after = "an eviction of its sandbox task" if self.why == EVICTED else "an out-of-memory kill"
        return f"size {self.size}, up from {self.up_from} after {after}"

    def as_data(self) -> dict[str, str | None]:
        return {"size": self.size, "up_from": self.up_from, "why": self.why if self.up_from else None}


EVICTED = "evicted"


def attempt_size(size: str | None, earlier: Iterable[tuple[FailureKind | str | None, str]]) -> AttemptSize:
    """The size of the next attempt: the agent's `size:` (the default when it says none),
    one up for every earlier attempt of this pass (its kind and reason) whose kind is
    `memory`, never past `large`."""
    now = size if size in ORDER else DEFAULT_SIZE
    stepped = AttemptSize(now)
    for kind, reason in earlier:
        if kind == FailureKind.memory and (up := one_up(now)) is not None:
            stepped = AttemptSize(up, now, EVICTED if EVICTED in reason else "out of memory")
            now = up
    return stepped


def memory_failure(size: str | None, what: str, limit: str | None = None) -> StepFailed:
    """The failure of an attempt killed for memory at `size` (`what` says what happened,
    `limit` the memory a program had): retryable one size up, or for good at `large`."""
    now = size if size in ORDER else DEFAULT_SIZE
    said = f"{what} at size {now}" + (f" ({limit})" if limit else "")
    up = one_up(now)
    if up is None:
        return StepFailed(f"{said}, the largest size", retryable=False, kind=FailureKind.other)
    return StepFailed(f"{said}; the next attempt runs at size {up}", kind=FailureKind.memory)
