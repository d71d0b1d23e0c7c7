"""An attempt's size after memory kills (domain/sizes.py), and what counts as a program killed
for memory (executors/memory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from laneflow.adapters.executors import memory
from laneflow.adapters.executors.memory import memory_kill, oom_kills
from laneflow.adapters.executors.programs import Finished
from laneflow.domain.records import FailureKind
from laneflow.domain.sizes import AttemptSize, attempt_size, memory_failure, one_up


def test_each_memory_kill_steps_the_next_attempt_one_size_up_and_large_stays_large() -> None:
    assert [one_up(s) for s in ("small", "medium", "large", None)] == ["medium", "large", None, "large"]
    kill, other = (FailureKind.memory, "bash ran out of memory (MemoryError) at size small"), (FailureKind.model, "API down")
    assert attempt_size("small", []) == AttemptSize("small")
    assert attempt_size("small", [other]) == AttemptSize("small")
    assert attempt_size("small", [kill]) == AttemptSize("medium", up_from="small")
    assert attempt_size("small", [kill, other, kill]) == AttemptSize("large", up_from="medium")
    assert attempt_size(None, [kill]) == AttemptSize("large", up_from="medium")  # the default is medium
    assert attempt_size("large", [kill, kill]) == AttemptSize("large")
    assert attempt_size("small", [("memory", kill[1])]) == AttemptSize("medium", up_from="small")  # as a store reads it back
    evicted = attempt_size(
        "medium", [(FailureKind.memory, "interrupted: its sandbox task was evicted (a Fargate Spot interruption)")]
    )
    assert evicted.line() == "size large, up from medium after an eviction of its sandbox task"
    assert attempt_size("small", [kill]).line() == "size medium, up from small after an out-of-memory kill"


def test_a_memory_kill_is_retryable_one_size_up_and_fails_for_good_at_large() -> None:
    small = memory_failure("small", "bash ran out of memory (MemoryError)", "512 MiB a process")
    assert small.retryable and small.kind == FailureKind.memory
    assert (
        small.reason
        == "bash ran out of memory (MemoryError) at size small (512 MiB a process); the next attempt runs at size medium"
    )
    large = memory_failure("large", "its sandbox task was stopped for memory")
    assert not large.retryable and large.kind == FailureKind.other
    assert large.reason == "its sandbox task was stopped for memory at size large, the largest size"


def finished(code: int | None, stderr: str = "") -> Finished:
    return Finished(code, "", stderr, 0, len(stderr))


@pytest.mark.parametrize(
    "stderr",
    [
        'Traceback (most recent call last):\n  File "x", line 1\nMemoryError\n',
        "bash: xrealloc: cannot allocate 532328448 bytes\n",
        "sort: Cannot allocate memory\n",
        "terminate called after throwing an instance of 'std::bad_alloc'\n",
        "memory allocation of 1073741824 bytes failed\n",
        'Exception in thread "main" java.lang.OutOfMemoryError: Java heap space\n',
        "fatal error: runtime: out of memory\n",
    ],
)
def test_a_failed_program_whose_runtime_says_it_ran_out_of_memory_was_killed_for_memory(stderr: str) -> None:
    how = memory_kill(finished(1, "earlier lines\n" + stderr), None)
    assert how is not None and how.startswith("ran out of memory (")


def test_a_success_a_kill_by_laneflow_a_plain_failure_or_a_crash_is_not_a_memory_kill() -> None:
    assert memory_kill(finished(0, "MemoryError\n"), None) is None  # it coped
    assert memory_kill(finished(None, "MemoryError\n"), None) is None  # laneflow killed it (a stop, a limit)
    assert memory_kill(finished(2, "grep: no such file\n"), None) is None
    assert memory_kill(finished(-11, "Segmentation fault\n"), None) is None
    assert memory_kill(finished(1, "MemoryError\n" + "x" * memory.STDERR_TAIL), None) is None  # not its last words


def test_a_sigkill_is_a_memory_kill_only_when_the_cgroups_oom_killer_killed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    monkeypatch.setattr(memory, "OOM_COUNTS", (str(tmp_path / "absent"), str(events)))
    before = oom_kills()
    assert before == 1
    assert memory_kill(finished(-9), before) is None  # RLIMIT_CPU's hard limit kills with SIGKILL too
    events.write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert memory_kill(finished(-9), before) == "was killed by the out-of-memory killer"
    assert memory_kill(finished(137), before) == "was killed by the out-of-memory killer"  # through bubblewrap or a shell
    assert memory_kill(finished(1), before) is None
    monkeypatch.setattr(memory, "OOM_COUNTS", (str(tmp_path / "absent"),))
    assert oom_kills() is None and memory_kill(finished(-9), None) is None
