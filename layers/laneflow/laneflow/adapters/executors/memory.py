"""Whether a step's program was killed for memory (`memory_kill`): the attempt then fails
for its size (domain/sizes.py), not the model's to fix, and the next attempt runs one size up.

A program's memory is bound by RLIMIT_AS (limits.py): past it the kernel refuses the
allocation (ENOMEM) and sends no signal, so the program's own runtime is what says it ran
out, as it dies. What counts:
- a program that ended with a non-zero exit and whose stderr's end carries one of the
  allocation failures runtimes print (`ALLOCATION_FAILED`: Python's MemoryError, C's
  "Cannot allocate memory", bash's xmalloc, C++'s bad_alloc, Rust's "memory allocation of N
  bytes failed", Java's OutOfMemoryError, Go's and Node's "out of memory");
- a program killed by SIGKILL (-9, or 137 through bubblewrap or a shell) while the
  out-of-memory killer of laneflow's own memory cgroup killed something (its `oom_kill`
  count rose over the program's run): where laneflow runs in a container with a memory
  limit (a Fargate task), the kernel kills the largest process of the container there.
A SIGSEGV or SIGABRT alone is not counted: a crash is more often the program's own bug, and
the runtimes that abort for memory say so first. A SIGKILL with no rise of the count is not
either: RLIMIT_CPU's hard limit kills with it too.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from laneflow.adapters.executors.programs import Finished

# Where the kernel counts its out-of-memory kills of this process's memory cgroup: cgroup v2,
# then v1 (a container sees its own cgroup at the top of its mount).
OOM_COUNTS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")

ALLOCATION_FAILED = re.compile(
    r"MemoryError|Cannot allocate memory|x(?:m|re|c)alloc: .*cannot allocate|std::bad_alloc|"
    r"memory allocation of \d+ bytes failed|OutOfMemoryError|out of memory",
    re.IGNORECASE,
)

STDERR_TAIL = 4_000  # how much of its stderr's end is read: a runtime's last words

KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)


def oom_kills() -> int | None:
    """How many processes the out-of-memory killer of this process's memory cgroup has
    killed (None where no count can be read)."""
    for path in OOM_COUNTS:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def memory_kill(done: Finished, oom_before: int | None) -> str | None:
    """How the program was killed for memory (see the module's docstring), or None. Its
    `oom_before` is `oom_kills()` as it started."""
    if done.exit_code is None or done.exit_code == 0:  # ended by laneflow (a stop, a limit), or fine
        return None
    if done.exit_code in KILLED and oom_before is not None and (oom_kills() or 0) > oom_before:
        return "was killed by the out-of-memory killer"
    found = ALLOCATION_FAILED.search(done.stderr[-STDERR_TAIL:])
    return f"ran out of memory ({found.group(0)})" if found else None
