"""A process that drives runs (`LocalDrives`, what `laneflow serve` runs) caps its malloc
arenas: glibc would give each of moto's many short-lived threads an arena of its own, up
to 8 per core, each keeping the free memory of its busiest moment, and the process's
resident memory crept up drive after drive. Counted in a fresh process (arenas are never
given back), from glibc's own report of its heaps."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's malloc arenas"
)

THREADS = 8

COUNT_ARENAS = f"""
import ctypes, sys, tempfile, threading
from laneflow.adapters.engine.local import LocalDrives
if sys.argv[1] == "drives":
    LocalDrives(lambda: None, pool=1)  # serve's drives, before any of their threads
at_once = threading.Barrier({THREADS})
def allocate():
    kept = [ctypes.create_string_buffer(4096) for _ in range(64)]  # malloc, on this thread
    at_once.wait()
threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as report:
    out = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, out)
    libc.fclose(out)
    print(open(report.name).read().count("<heap nr="))
"""


def _arenas(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, mode], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return int(done.stdout.strip())


def test_serve_s_drives_cap_the_process_s_malloc_arenas() -> None:
    from laneflow.adapters.engine.local import MALLOC_ARENAS

    assert _arenas("plain") > MALLOC_ARENAS  # threads at once get arenas of their own
    assert _arenas("drives") <= MALLOC_ARENAS


def test_a_malloc_arena_max_in_the_environment_is_left_to_stand(monkeypatch: pytest.MonkeyPatch) -> None:
    from laneflow.adapters.engine.local import bound_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert bound_malloc_arenas() is False


def test_free_pages_are_handed_back() -> None:
    import ctypes

    from laneflow.adapters.engine.local import release_free_memory

    blocks = [ctypes.create_string_buffer(16384) for _ in range(2048)]  # 32 MiB of malloc's heap
    del blocks[::2]  # half of it free, in holes between blocks still in use
    assert release_free_memory() is True
