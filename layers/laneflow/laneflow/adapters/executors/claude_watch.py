"""How a stop ends a Claude model call at once, at any point of its HTTP request (before its
response's headers too, while it waits for its first token): one watcher thread (the
executor's, `Watcher`) polls each call's `sink.stopped()` and shuts the socket its request
went out on (`CallWatch`), which the call learns through httpx's `trace` extension
(`CallSockets`)."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anthropic

from laneflow.domain.errors import AttemptEnded
from laneflow.ports import ExecutionSink


class Watcher:
    """One thread that watches every model call of an executor while it is in flight.

    A thread a call cost a thread's creation on each call's critical path (about 0.3 ms of
    CPU, with a hundred siblings starting at once) and a hundred threads waking ten times a
    second to ask the same question. The thread starts with the first call and ends once
    no call is left. It asks the calls one after another: a sink reads the store at most
    every 0.5 s, so a sweep over N calls whose store answers in L costs about N x L / 5 (50
    calls on a DynamoDB table 50 ms away: 0.5 s), and a stop reaches the last call that
    much later; in the cloud a step's process has one call."""

    def __init__(self, poll_s: float = 0.1):
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._calls: set[CallWatch] = set()
        self._thread: threading.Thread | None = None

    def add(self, call: CallWatch) -> None:
        with self._lock:
            self._calls.add(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="laneflow-call-watch", daemon=True)
                self._thread.start()

    def remove(self, call: CallWatch) -> None:
        with self._lock:
            self._calls.discard(call)

    def _watch(self) -> None:
        try:
            while True:
                time.sleep(self.poll_s)
                with self._lock:
                    calls = list(self._calls)
                    if not calls:
                        self._thread = None
                        return
                for call in calls:
                    call.check()
        except BaseException:
            # Whatever ended it, the next call in flight starts another: the calls are never
            # left without a watcher.
            with self._lock:
                self._thread = None
            raise


class CallWatch:
    """Ends one model call's HTTP request as soon as the run's stop is requested.

    The stream's reader blocks in a socket read while the model thinks (20 s to a first
    token is not rare), and before that while the API (or a proxy) holds the response's
    headers, so checking `sink.stopped()` between events would see a stop only when the next
    event comes. The executor's watcher thread asks it instead, every `poll_s`, and on a stop
    shuts down the socket the call's request went out on, which wakes that read at once
    (closing the response, or the connection, alone waits for the next byte). The socket is
    the call's from the moment its request is written on it (`using`, told by
    `CallSockets`) until its response is closed; a stop that comes before (while the
    connection is being opened) shuts it the moment the request is written."""

    def __init__(self, sink: ExecutionSink, watcher: Watcher):
        self.sink, self.watcher = sink, watcher
        self.fired = threading.Event()
        self.sent: float | None = None  # when (monotonic) its request was written whole
        self._lock = threading.Lock()
        self._response: Any = None
        self._stream: Any = None  # the network stream the request went out on, while it is this call's

    def start(self) -> CallWatch:
        self.watcher.add(self)
        return self

    def close(self) -> None:
        """The call is over: it is watched no more."""
        self.watcher.remove(self)

    def attach(self, response: Any) -> None:
        with self._lock:
            self._response = response
        if self.fired.is_set():
            self._abort()

    def using(self, stream: Any) -> None:
        """The call's request is being written on `stream` (a connection of the client's
        pool, new or reused); None once its response is closed and the connection may serve
        another call."""
        with self._lock:
            if stream is self._stream:
                return
            self._stream = stream
        if stream is not None and self.fired.is_set():
            self._abort()

    def check(self) -> None:
        """One look at the sink (on the watcher's thread): a stop ends the call."""
        if self.fired.is_set():
            return
        try:
            stop = self.sink.stopped()
        except AttemptEnded:
            stop = True  # someone ended the attempt (a stop, an interruption): the call is over too
        except Exception:  # a store hiccup: look again at the next poll
            return
        if stop:
            self.fired.set()
            self.close()
            self._abort()

    def _abort(self) -> None:
        with self._lock:
            response, self._response = self._response, None
            network = self._stream
        if network is None and response is not None:
            network = response.extensions.get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed
        if response is None:
            return
        try:
            response.close()
        except Exception:  # the reader sees the shut socket either way
            pass


class CallSockets:
    """Tells each model call which connection its request goes out on, so a stop can shut
    that socket before the response's headers have come (an overloaded API, a proxy holding
    the response), when the response, the only place the SDK shows a connection, does not
    exist yet.

    Only public hooks: the anthropic SDK takes its HTTP client (`http_client=`, the SDK's own
    `DefaultHttpxClient`, so its timeouts, connection limits, keep-alive options and proxies
    from the environment stay as they are); httpx runs the client's `request` event hooks on
    the calling thread before it sends; a request's `trace` extension (httpx and httpcore's
    documented one) tells each connection it opens, with its network stream
    (`connection.connect_tcp.complete`, `connection.start_tls.complete`), and when its
    response is closed (`http11.response_closed.started`, before the connection goes back
    to the pool). A connection the pool reuses for a later call opens nothing, so each stream
    the client opens has its `write` (the network stream interface's method httpcore sends
    a request with) tell the call of the thread writing on it. HTTP/1.1 only (the SDK's
    default): a connection carries one request at a time, so its socket is that call's alone.
    Cost: a thread-local read per write on a stream, and nothing per event read."""

    OPENED = (
        "connection.connect_tcp.complete",
        "connection.connect_unix_socket.complete",
        "connection.start_tls.complete",
        "http_proxy.start_tls.complete",  # TLS inside a proxy's tunnel
    )

    def __init__(self) -> None:
        self._calls = threading.local()  # the call this thread is making: its `CallWatch`

    @contextmanager
    def calling(self, watch: CallWatch) -> Iterator[None]:
        """The calls made on this thread meanwhile are `watch`'s."""
        self._calls.watch = watch
        try:
            yield
        finally:
            self._calls.watch = None

    def client(self) -> Any:
        """An HTTP client for the SDK, with the SDK's defaults, whose requests say their
        connections."""
        return anthropic.DefaultHttpxClient(event_hooks={"request": [self._on_request]})

    def _current(self) -> CallWatch | None:
        return getattr(self._calls, "watch", None)

    def _on_request(self, request: Any) -> None:
        watch = self._current()
        if watch is not None:  # the request's events are its call's, whichever thread closes its response
            request.extensions["trace"] = functools.partial(self._trace, watch)

    def _trace(self, watch: CallWatch, event: str, info: dict[str, Any]) -> None:
        if event in self.OPENED:
            stream = info.get("return_value")
            if stream is not None:
                self._tell_writers(stream)
                watch.using(stream)
        elif event == "http11.send_request_body.complete":
            watch.sent = time.monotonic()
        elif event == "http11.response_closed.started":
            watch.using(None)

    def _tell_writers(self, stream: Any) -> None:
        """From now on, a request written on `stream` makes it its call's (for a connection
        reused by later calls, which open nothing)."""
        write = stream.write
        if getattr(write, "tells_its_call", False):
            return

        def tell_and_write(buffer: bytes, timeout: float | None = None) -> None:
            watch = self._current()
            if watch is not None:
                watch.using(stream)
            write(buffer, timeout)

        tell_and_write.tells_its_call = True  # type: ignore[attr-defined]
        stream.write = tell_and_write
