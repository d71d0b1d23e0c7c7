"""The crash points the wiring gives: nothing happens at them, except in a process started
with LANEFLOW_CRASH_AT, which dies at the point it names (the K-th time it is reached)."""

from __future__ import annotations

import subprocess
import sys

from laneflow.adapters.crash import KillingCrashPoints
from laneflow.ports.services import NoCrashPoints
from laneflow.settings import Settings
from laneflow.usecases.crashpoints import POINTS
from laneflow.wiring import crash_points


def test_only_a_process_told_where_to_crash_gets_points_that_kill() -> None:
    assert isinstance(crash_points(Settings.from_env({})), NoCrashPoints)
    told = crash_points(Settings.from_env({"LANEFLOW_CRASH_AT": "after-claim:2", "LANEFLOW_ENGINE_WORKER": '{"pid": 1}'}))
    assert isinstance(told, KillingCrashPoints)
    assert (told.spec, told.engine_worker) == ("after-claim:2", '{"pid": 1}')
    for point in POINTS:
        NoCrashPoints().reached(point)  # nothing happens: this test goes on
    KillingCrashPoints("after-claim").reached("parked")  # another point: nothing either


def test_a_process_dies_by_sigkill_the_k_th_time_it_reaches_its_point() -> None:
    script = (
        "from laneflow.adapters.crash import KillingCrashPoints\n"
        "points = KillingCrashPoints('parked:2')\n"
        "points.reached('parked'); print('first', flush=True)\n"
        "points.reached('parked'); print('second', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9 and done.stdout == "first\n"
