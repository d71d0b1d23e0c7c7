"""The forwarder inside a sandbox that has its own network namespace: it listens on
127.0.0.1:<port> there and relays each connection to the egress proxy's Unix socket, bound
into the sandbox; then the program runs (exec) with HTTP_PROXY pointing at that port.

    python3 -I -S -c <this file's source> <socket> <port> -- <program> <args...>

It runs under the sandbox's own python3 (the host's, from the system folders bound read-only
into the sandbox), so it imports nothing but the standard library and keeps to what Python 3.8
has. It binds before the program starts (no connection is refused for being early), then
forks twice: the relay is reparented to the sandbox's init and ends with the sandbox's pid
namespace when the program ends (and, outside one, leaves within WATCH_S of the program's
end by itself); the program itself is exec'd, so its pipes, exit code and signals are its
own. The relay is one thread and one selector (the step's process limit counts threads),
with a bounded buffer per direction.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys

CHUNK = 65_536

MAX_BUFFER = 1_048_576  # per direction: past it, the relay stops reading that side until it drains

WATCH_S = 0.5  # how often the relay looks whether the program is still there


class _Side:
    """One socket of a relayed pair: what is waiting to be written to it, and whether its
    peer has finished sending (then, once drained, it is shut for writing)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.peer: _Side = self
        self.out = bytearray()
        self.read_done = False  # this side sent its end
        self.write_done = False  # shut for writing: its peer's end was passed on


class _Relay:
    def __init__(self, server: socket.socket, target: str) -> None:
        self.server, self.target = server, target
        self.selector = selectors.DefaultSelector()
        self.sides: dict[socket.socket, _Side] = {}
        self.watched: dict[socket.socket, int] = {}  # what the selector waits for on each (absent: nothing)

    def run(self, program: int) -> None:
        self.server.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ)
        while _alive(program):
            for key, mask in self.selector.select(WATCH_S):
                sock = key.fileobj
                if sock is self.server:
                    self._accept()
                    continue
                assert isinstance(sock, socket.socket)
                side = self.sides.get(sock)
                if side is None:
                    continue
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(side)
                    if mask & selectors.EVENT_WRITE:
                        self._write(side)
                except OSError:
                    self._close(side)
                    continue
                self._update(side)
                self._update(side.peer)

    def _accept(self) -> None:
        try:
            client, _ = self.server.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)
        except OSError:
            client.close()
            upstream.close()
            return
        a, b = _Side(client), _Side(upstream)
        a.peer, b.peer = b, a
        for side in (a, b):
            side.sock.setblocking(False)
            self.sides[side.sock] = side
            self._watch(side.sock, selectors.EVENT_READ)

    def _watch(self, sock: socket.socket, events: int) -> None:
        now = self.watched.get(sock, 0)
        if events == now:
            return
        if not events:
            self.selector.unregister(sock)
            del self.watched[sock]
        elif now:
            self.selector.modify(sock, events)
            self.watched[sock] = events
        else:
            self.selector.register(sock, events)
            self.watched[sock] = events

    def _read(self, side: _Side) -> None:
        try:
            data = side.sock.recv(CHUNK)
        except BlockingIOError:
            return
        if data:
            side.peer.out += data
        else:
            side.read_done = True

    def _write(self, side: _Side) -> None:
        try:
            sent = side.sock.send(side.out)
        except BlockingIOError:
            return
        del side.out[:sent]

    def _update(self, side: _Side) -> None:
        if side.sock not in self.sides:
            return
        if side.peer.read_done and not side.out and not side.write_done:
            side.write_done = True
            try:
                side.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if side.read_done and side.write_done and side.peer.write_done:
            self._close(side)
            return
        events = 0
        if not side.read_done and len(side.peer.out) < MAX_BUFFER:
            events |= selectors.EVENT_READ
        if side.out:
            events |= selectors.EVENT_WRITE
        self._watch(side.sock, events)

    def _close(self, side: _Side) -> None:
        for one in (side, side.peer):
            if self.sides.pop(one.sock, None) is not None:
                self._watch(one.sock, 0)
                one.sock.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def main(args: list[str]) -> None:
    target, port, argv = args[0], int(args[1]), args[3:]
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)
    program = os.getpid()  # exec'd into the program below
    first = os.fork()
    if first == 0:
        if os.fork() != 0:
            os._exit(0)  # the relay's parent leaves at once: the relay is the sandbox init's child
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)  # never holds the program's pipes open
        try:
            _Relay(server, target).run(program)
        finally:
            os._exit(0)
    os.waitpid(first, 0)
    server.close()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
