"""The Claude executor's stop watch: one thread watches every call in flight, a stop ends
only the call whose run was stopped, and the thread ends with the last call."""

from __future__ import annotations

import threading
import time

import pytest

from laneflow.adapters.executors.anthropic import _CallWatch, _Watcher


class Sink:
    def __init__(self) -> None:
        self.stop = False
        self.asked = 0

    def stopped(self) -> bool:
        self.asked += 1
        return self.stop


def watching(watcher: _Watcher) -> threading.Thread | None:
    """The watcher's thread while it runs (this watcher's own: other tests' executors have theirs)."""
    thread = watcher._thread
    return thread if thread is not None and thread.is_alive() else None


def wait_for(check, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return check()


def test_one_thread_watches_many_calls_and_a_stop_ends_only_its_own_call():
    watcher = _Watcher(poll_s=0.01)
    sinks = [Sink() for _ in range(50)]
    first = _CallWatch(sinks[0], watcher).start()
    thread = watching(watcher)
    calls = [first, *(_CallWatch(sink, watcher).start() for sink in sinks[1:])]
    assert thread is not None and watching(watcher) is thread  # fifty calls, one thread
    assert sum(1 for t in threading.enumerate() if t is thread) == 1
    assert wait_for(lambda: all(sink.asked >= 2 for sink in sinks))  # every call is asked, again and again

    sinks[7].stop = True
    assert wait_for(calls[7].fired.is_set)
    assert not any(call.fired.is_set() for i, call in enumerate(calls) if i != 7)
    asked = sinks[7].asked
    time.sleep(0.05)
    assert sinks[7].asked == asked  # a fired call is watched no more

    for call in calls:
        call.close()
    assert wait_for(lambda: watching(watcher) is None and not thread.is_alive())  # the last call gone, the thread ends
    again = _CallWatch(Sink(), watcher).start()  # and the next call starts it again
    assert watching(watcher) not in (None, thread)
    again.close()
    assert wait_for(lambda: watching(watcher) is None)


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


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # its death is the point
def test_a_watcher_that_dies_is_started_again_by_the_next_call():
    class Broken(Sink):
        def stopped(self) -> bool:
            raise SystemExit  # not a store hiccup: it ends the watcher's thread

    watcher = _Watcher(poll_s=0.01)
    broken = _CallWatch(Broken(), watcher).start()
    dying = watcher._thread
    assert dying is not None and wait_for(lambda: not dying.is_alive())  # it died
    broken.close()
    sink = Sink()
    sink.stop = True
    call = _CallWatch(sink, watcher).start()  # the next call has a watcher again
    assert wait_for(call.fired.is_set)
