"""The Claude executor's stop watch: one thread watches every call in flight, a stop ends
only the call whose run was stopped, and the thread ends with the last call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from laneflow.adapters.executors.claude_watch import CallWatch as _CallWatch
from laneflow.adapters.executors.claude_watch import Watcher as _Watcher


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


def wait_for(check: Callable[[], bool], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.005)
    return check()


def test_one_thread_watches_many_calls_and_a_stop_ends_only_its_own_call() -> None:
    watcher = _Watcher(poll_s=0.01)
    sinks = [Sink() for _ in range(50)]
    first = _CallWatch(sinks[0], watcher).start()  # type: ignore[arg-type]
    thread = watching(watcher)
    calls = [first, *(_CallWatch(sink, watcher).start() for sink in sinks[1:])]  # type: ignore[arg-type]
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
    again = _CallWatch(Sink(), watcher).start()  # type: ignore[arg-type]  # and the next call starts it again
    assert watching(watcher) not in (None, thread)
    again.close()
    assert wait_for(lambda: watching(watcher) is None)


def test_a_stop_before_the_response_arrives_closes_it_as_it_is_attached() -> None:
    class Response:
        extensions: dict[str, Any] = {}
        closed = False

        def close(self) -> None:
            self.closed = True

    watcher = _Watcher(poll_s=0.01)
    sink = Sink()
    sink.stop = True
    call = _CallWatch(sink, watcher).start()  # type: ignore[arg-type]
    assert wait_for(call.fired.is_set)
    response = Response()
    call.attach(response)
    assert response.closed


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # its death is the point
def test_a_watcher_that_dies_is_started_again_by_the_next_call() -> None:
    class Broken(Sink):
        def stopped(self) -> bool:
            raise SystemExit  # not a store hiccup: it ends the watcher's thread

    watcher = _Watcher(poll_s=0.01)
    broken = _CallWatch(Broken(), watcher).start()  # type: ignore[arg-type]
    dying = watcher._thread
    assert dying is not None and wait_for(lambda: not dying.is_alive())  # it died
    broken.close()
    sink = Sink()
    sink.stop = True
    call = _CallWatch(sink, watcher).start()  # type: ignore[arg-type]  # the next call has a watcher again
    assert wait_for(call.fired.is_set)


# -- a stop before the response's headers, on a connection the pool reuses ------------------------


class KeptAlive:
    """A loopback HTTP/1.1 server that keeps connections open (as the real API does, and the
    imitation does not: it closes each one): it answers a Message with a Content-Length, or,
    while `hold` is set, holds the response's headers until the caller goes away. It counts
    the connections it accepted and the callers that left while held."""

    def __init__(self) -> None:
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self
        self.hold = threading.Event()
        self.connections = 0
        self.left = 0
        self.held = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                owner.connections += 1

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if owner.hold.is_set():
                    owner.held.set()
                    self.connection.settimeout(30)
                    if not self.connection.recv(1):  # the caller shut its end: it left
                        owner.left += 1
                    self.close_connection = True
                    return
                body = json.dumps(
                    {
                        "id": "msg_kept",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-sonnet-4-6",
                        "content": [{"type": "text", "text": "done"}],
                        "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": {"input_tokens": 3, "output_tokens": 1},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ask(client: Any, sockets: Any, watch: Any) -> str:
    with sockets.calling(watch):
        message = client.messages.create(model="claude-sonnet-4-6", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    answer: str = message.content[0].text
    return answer


def test_a_stop_ends_a_call_held_before_its_headers_on_a_reused_connection_and_only_that_call() -> None:
    """The second call goes out on the first one's kept-alive connection (it opens nothing,
    so only its write tells which socket is its own); the server holds its headers. A stop
    ends it within a second, and the other call in flight on its own connection is untouched."""
    import anthropic

    from laneflow.adapters.executors.claude_watch import CallSockets as _CallSockets

    server = KeptAlive()
    try:
        sockets = _CallSockets()
        client = anthropic.Anthropic(api_key="k", base_url=server.url, max_retries=0, http_client=sockets.client())
        watcher = _Watcher(poll_s=0.01)
        first = _CallWatch(Sink(), watcher).start()  # type: ignore[arg-type]
        assert ask(client, sockets, first) == "done"
        first.close()
        assert server.connections == 1

        server.hold.set()
        stopped, other = Sink(), Sink()
        outcome: dict[str, Any] = {}

        def call(name: str, sink: Sink) -> None:
            watch = _CallWatch(sink, watcher).start()  # type: ignore[arg-type]
            try:
                outcome[name] = ask(client, sockets, watch)
            except anthropic.APIConnectionError as error:
                outcome[name] = error
            finally:
                watch.close()

        held = threading.Thread(target=call, args=("stopped", stopped))
        held.start()
        assert server.held.wait(5)
        bystander = threading.Thread(target=call, args=("other", other))
        bystander.start()
        assert wait_for(lambda: server.connections == 2)  # the bystander needed a connection of its own
        time.sleep(0.2)
        stopped.stop = True
        held.join(15)  # the server holds a response up to 30 s: ended within this bound, the stop ended it
        assert not held.is_alive(), "the stop did not end the held call"
        assert isinstance(outcome["stopped"], anthropic.APIConnectionError)
        assert wait_for(lambda: server.left == 1)
        time.sleep(0.2)
        assert bystander.is_alive() and "other" not in outcome  # still held, its socket untouched
        other.stop = True
        bystander.join(5)
        assert not bystander.is_alive() and isinstance(outcome["other"], anthropic.APIConnectionError)
        assert wait_for(lambda: server.left == 2)  # the server hears the close a moment later
    finally:
        server.close()
