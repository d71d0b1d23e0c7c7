"""Worker references and whether each kind is still there (`Liveness.alive` by kind)."""

from __future__ import annotations

import os
import socket

from laneflow.adapters.workers import GRACE_S, Liveness, current_worker, local_worker
from laneflow.domain.workers import FargateTask, LambdaRequest, LocalProcess, StepFunctionsExecution, dumps, loads


class Context:
    aws_request_id = "req-9"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def test_each_kind_is_asked_about_in_its_own_way() -> None:
    asked: list[tuple[str, str]] = []
    liveness = Liveness(
        execution_alive=lambda arn: asked.append(("sfn", arn)) or False,  # type: ignore[func-returns-value]
        task_alive=lambda arn: asked.append(("ecs", arn)) or True,  # type: ignore[func-returns-value]
        now=lambda: 1000.0,
    )
    assert liveness.alive(local_worker()) is True  # this very process
    assert (
        liveness.alive(LocalProcess(host=socket.gethostname(), pid=os.getpid(), started="not-its-start")) is False
    )  # a reused pid
    assert liveness.alive(LocalProcess(host="another-host", pid=1)) is None  # cannot tell from here
    assert liveness.alive(LambdaRequest(request_id="r", deadline=1000.0 - GRACE_S)) is True
    assert liveness.alive(LambdaRequest(request_id="r", deadline=1000.0 - GRACE_S - 1)) is False
    assert liveness.alive(StepFunctionsExecution(execution="arn:e")) is False
    assert liveness.alive(FargateTask(task="arn:t", cluster="c")) is True
    assert asked == [("sfn", "arn:e"), ("ecs", "arn:t")]
    assert Liveness().alive(StepFunctionsExecution(execution="arn:e")) is None  # nobody to ask
    assert Liveness().alive(None) is None


def test_a_worker_known_to_be_leaving_counts_as_gone_and_a_lambda_is_the_same_request_whatever_its_deadline() -> None:
    me = local_worker()
    assert Liveness(gone=me).alive(me) is False
    first, again = current_worker(Context()), current_worker(Context())
    assert isinstance(first, LambdaRequest) and first.same(again) and not first.same(me)
    assert current_worker() == me


def test_a_reference_reads_back_from_the_text_it_is_kept_as() -> None:
    for worker in (
        local_worker(),
        LambdaRequest(request_id="r", deadline=1.5),
        StepFunctionsExecution(execution="arn:e"),
        FargateTask(task="arn:t"),
    ):
        assert loads(dumps(worker)) == worker
    assert loads(None) is None and loads("") is None and loads("pid:1") is None


def test_a_dead_process_whose_exit_nobody_has_collected_is_gone() -> None:
    """A zombie keeps its pid and its start time until its parent reaps it (or, once that
    parent has died too, whoever inherits it): a worker killed with its parent can linger so
    for a while, and works on nothing."""
    import subprocess
    import time

    from laneflow.adapters.workers import _process_start

    child = subprocess.Popen(["true"])
    zombie = LocalProcess(host=socket.gethostname(), pid=child.pid, started=_process_start(child.pid))
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert zombie.started is not None
        assert Liveness().alive(zombie) is False
    finally:
        child.wait()
    assert Liveness().alive(zombie) is False  # collected: no such process
