"""The Claude executor's stop watch: one thread watches every call in flight, a stop ends
only the call whose run was stopped, and the thread ends with the last call."""

from __future__ import annotations

import threading
import time

from laneflow.adapters.executors.anthropic import _CallWatch, _Watcher


class Sink:
    def __init__(self) -> None:
        self.stop = False
        self.asked = 0

    def stopped(self) -> bool:
        self.asked += 1
        return self.stop


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "laneflow-call-watch"]


def wait_for(check, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return check()


def test_one_thread_watches_many_calls_and_a_stop_ends_only_its_own_call():
    before = len(watch_threads())
    watcher = _Watcher(poll_s=0.01)
    sinks = [Sink() for _ in range(50)]
    calls = [_CallWatch(sink, watcher).start() for sink in sinks]
    assert len(watch_threads()) == before + 1  # fifty calls, one thread
    assert wait_for(lambda: all(sink.asked >= 2 for sink in sinks))  # every call is asked, again and again

    sinks[7].stop = True
    assert wait_for(calls[7].fired.is_set)
    assert not any(call.fired.is_set() for i, call in enumerate(calls) if i != 7)
    asked = sinks[7].asked
    time.sleep(0.05)
    assert sinks[7].asked == asked  # a fired call is watched no more

    for call in calls:
        call.close()
    assert wait_for(lambda: len(watch_threads()) == before)  # the last call gone, the thread ends
    again = _CallWatch(Sink(), watcher).start()  # and the next call starts it again
    assert len(watch_threads()) == before + 1
    again.close()
    assert wait_for(lambda: len(watch_threads()) == before)


def test_a_stop_before_the_response_arrives_closes_it_as_it_is_attached():
    class Response:
        extensions: dict = {}
        closed = False

        def close(self) -> None:
            self.closed = True

    watcher = _Watcher(poll_s=0.01)
    sink = Sink()
    sink.stop = True
    call = _CallWatch(sink, watcher).start()
    assert wait_for(call.fired.is_set)
    response = Response()
    call.attach(response)
    assert response.closed
