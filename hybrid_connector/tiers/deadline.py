"""One deadline per remote call, enforced on every blocking socket operation.

``scope(seconds)`` sets the calling thread's deadline for the code inside it. A socket
wrapped in ``DeadlineSocket`` sets its timeout to what is left of that deadline before
each blocking send or receive, so a peer that trickles a reply one byte at a time cannot
stretch a call past it (a plain socket timeout restarts with every byte). ``left()``
gives the seconds left (for connects) and raises ``TimeoutError`` once it has passed.
Deadlines are per thread, so concurrent calls in other threads keep their own.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_local = threading.local()


@contextmanager
def scope(seconds: float) -> Iterator[None]:
    """Run the body under a deadline ``seconds`` from now (nested scopes restore the outer
    one on exit)."""
    prev = getattr(_local, "at", None)
    _local.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.at = prev


def left() -> float | None:
    """Seconds left of this thread's deadline (None outside any ``scope``); raises
    ``TimeoutError`` when none is left."""
    at: float | None = getattr(_local, "at", None)
    if at is None:
        return None
    rem = at - time.monotonic()
    if rem <= 0:
        raise TimeoutError("remote call deadline passed")
    return rem


class DeadlineSocket:
    """A connected socket whose blocking operations never outlast the calling thread's
    deadline: each send/receive gets ``min(what is left, the socket's own timeout)``.
    A zero timeout (a non-blocking poll) is kept as is; everything else is delegated."""

    __slots__ = ("sock", "_timeout")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._timeout = sock.gettimeout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout
        self.sock.settimeout(timeout)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> None:
        rem = None if self._timeout == 0 else left()
        if rem is None:
            self.sock.settimeout(self._timeout)
        else:
            self.sock.settimeout(rem if self._timeout is None else min(rem, self._timeout))

    # Arguments pass through unchanged: ssl.SSLSocket's defaults differ from socket's.
    def recv(self, *args: Any) -> bytes:
        self._arm()
        return self.sock.recv(*args)

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return self.sock.recv_into(*args)

    def send(self, *args: Any) -> int:
        self._arm()
        return self.sock.send(*args)

    def sendall(self, *args: Any) -> None:
        self._arm()  # sendall's timeout covers the whole call (Python >= 3.5)
        self.sock.sendall(*args)
