"""One deadline for everything a request fetches by URL, ended early when its client leaves (issue 49, item 4).

A per-operation timeout (a socket's, httpx's) starts again with every byte that arrives: headers
trickled one line every 2 s held a request 120 s, and the fetch went on after the client had gone.
A :class:`FetchDeadline` is one budget of seconds for all the fetches of one request, spent by
every step of each, and it also ends the moment the request's ``stop_event`` is set (the client
disconnected: :func:`~refsight.server.edge.disconnect.client_stop`):

- DNS: ``getaddrinfo`` runs in a helper thread, waited for at most until the deadline (a lookup
  cannot be interrupted: a late one is left to finish on its own, under the system resolver's timeouts);
- connect: non-blocking, waited for in short ticks;
- everything after (TLS handshake, request, headers, body): a watchdog thread shuts the socket
  down the moment the deadline passes or the client leaves, which ends a blocked read at once,
  however slowly the server trickles.

Each wait checks at least every :data:`TICK_S`, so a fetch ends within about that of either.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["FetchDeadline", "FetchStopped", "TICK_S"]

#: The longest any wait goes without looking at the deadline and the client.
TICK_S = 0.1


class FetchStopped(Exception):
    """A fetch stopped: its deadline passed (``client_left`` False) or its client left (True)."""

    def __init__(self, client_left: bool) -> None:
        super().__init__("the client left" if client_left else "the deadline passed")
        self.client_left = client_left


class FetchDeadline:
    """``seconds`` from now for all the fetches of one request; over early once ``stop`` is set."""

    def __init__(self, seconds: float, stop: threading.Event | None = None) -> None:
        self.seconds = seconds
        self.stop = stop
        self.ends = time.monotonic() + seconds

    def stopped(self) -> FetchStopped | None:
        """Why fetching must stop now, or None while it may go on."""
        if self.stop is not None and self.stop.is_set():
            return FetchStopped(client_left=True)
        return FetchStopped(client_left=False) if time.monotonic() >= self.ends else None

    def check(self) -> None:
        """Raise :class:`FetchStopped` once the deadline has passed or the client has left."""
        reason = self.stopped()
        if reason is not None:
            raise reason

    def tick(self) -> float:
        """Seconds the next wait may take (at most :data:`TICK_S`); :class:`FetchStopped` when none are left."""
        self.check()
        return max(0.0, min(TICK_S, self.ends - time.monotonic()))

    def resolve(self, host: str, port: int) -> list[Any]:
        """``socket.getaddrinfo(host, port)`` for TCP, waited for no later than the deadline."""
        found: list[Any] = []

        def look_up() -> None:
            try:
                found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
            except OSError as e:
                found.append(e)

        lookup = threading.Thread(target=look_up, name="refsight-fetch-dns", daemon=True)
        lookup.start()
        while lookup.is_alive():
            lookup.join(self.tick())
        if isinstance(found[0], OSError):
            raise found[0]
        return found[0]

    def connect(self, address: str, port: int) -> socket.socket:
        """A TCP socket connected to ``address``, connected no later than the deadline (blocking from then on,
        a socket timeout of the time left)."""
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            code = sock.connect_ex((address, port))
            if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raise OSError(code, f"cannot connect to {address}:{port}")
            with selectors.DefaultSelector() as waiting:  # (select.select fails past fd 1024)
                waiting.register(sock, selectors.EVENT_WRITE)
                while not waiting.select(self.tick()):
                    pass
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, f"cannot connect to {address}:{port}")
            sock.settimeout(max(TICK_S, self.ends - time.monotonic()))  # the watchdog ends it sooner if need be
        except BaseException:
            sock.close()
            raise
        return sock

    @contextlib.contextmanager
    def guard(self, sock: socket.socket) -> Iterator[socket.socket]:
        """While the block runs, shut ``sock`` down once the deadline passes or the client leaves: any read or
        write blocked on it (a TLS one too: the shutdown reaches the connection, not one file descriptor)
        ends at once, and the caller finds out why from :meth:`stopped`."""
        wake = sock.dup()  # the TLS layer takes ``sock`` over; a duplicate still names the connection
        done = threading.Event()

        def watch() -> None:
            while not done.wait(TICK_S):
                if self.stopped() is not None:
                    with contextlib.suppress(OSError):
                        wake.shutdown(socket.SHUT_RDWR)
                    return

        watcher = threading.Thread(target=watch, name="refsight-fetch-watch", daemon=True)
        watcher.start()
        try:
            yield sock
        finally:
            done.set()
            watcher.join()
            wake.close()
