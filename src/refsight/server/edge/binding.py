"""Binding ``refsight serve`` to one address or several (llama-server's ``--host 127.0.0.1,::1``).

uvicorn binds one ``host``; for several, the sockets are opened here, one per address, and
handed to one uvicorn server, so every address serves the same app (one model, one pool).
An address that cannot be bound is an error before any request is served.
"""

from __future__ import annotations

import socket
from typing import Any, Callable

from ...errors import InvalidInputError

__all__ = ["split_hosts", "run"]


def split_hosts(host: str) -> tuple[str, ...]:
    """The addresses of a ``--host`` value: comma-separated, IPv6 brackets removed, at least one."""
    hosts = tuple(part.strip().strip("[]") for part in host.split(",") if part.strip())
    if not hosts:
        raise InvalidInputError("host", "names no address")
    return hosts


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (IPv6 sockets take IPv6 only, so ``::1`` beside 127.0.0.1 works)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise InvalidInputError(f"host {host}", f"cannot be bound: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted sockets inherit it: uvicorn writes a response's head and body apart, and on a socket it was
        # handed (not one it bound) Nagle then holds the body for the client's delayed ACK, ~40 ms per request.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise InvalidInputError(f"host {host}", f"cannot be bound on port {port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def run(app: Any, host: str, port: int, *, on_exit: Callable[[], None] = lambda: None, **options: Any) -> None:
    """Serve ``app`` under uvicorn on every address of ``host`` until interrupted; ``on_exit`` is called as soon as
    a signal says to stop (SIGTERM, SIGINT), before uvicorn waits for the requests in progress."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_exit()
            super().handle_exit(sig, frame)

    hosts = split_hosts(host)
    # One address: uvicorn binds it (as uvicorn.run does); several: bound here, one socket each.
    sockets = [_bind(one, port) for one in hosts] if len(hosts) > 1 else None
    server = Server(uvicorn.Config(app, host=hosts[0], port=port, **options))
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # Ctrl-C: a clean stop, as uvicorn.run ends it
        pass
    finally:
        for sock in sockets or ():
            sock.close()
    if not server.started:  # an address uvicorn could not bind: uvicorn.run's exit status for that
        raise SystemExit(3)
