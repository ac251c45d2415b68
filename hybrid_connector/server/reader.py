"""``FrameProtocol``: a connection's bytes read straight into the buffers frames need.

asyncio's ``StreamReader`` copies every byte through its own buffer (and ``readexactly``
copies it out again): for 50 MB states that is most of the server's CPU per byte. This is
a ``BufferedProtocol``: while a frame part is awaited (``readinto``), the transport reads
the socket directly into the caller's buffer; bytes that arrive when nothing is awaited
(a client sending its next frame early) are kept in a small spill buffer, and reading
pauses while that holds more than ``spill_limit`` (``SPILL_LIMIT``; the handler lowers it
for a connection that has not authenticated yet). Writes go through an ordinary
``StreamWriter`` (``drain`` waits while the transport's buffer is above its high mark:
the client does not read).

Each connection runs ``handler(protocol, writer)`` as its own task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

SPILL_LIMIT = 1 << 20
_SCRATCH = 1 << 16


class FrameProtocol(asyncio.BufferedProtocol):
    """One connection (see the module docstring). ``readinto``/``readexactly`` raise
    ``asyncio.IncompleteReadError`` when the connection ends first; one read at a time."""

    def __init__(self, handler: Callable[[FrameProtocol, asyncio.StreamWriter],
                                         Coroutine[Any, Any, None]],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._handler = handler
        self._evloop = loop
        self._scratch = memoryview(bytearray(_SCRATCH))
        self._spill = bytearray()
        self._target: memoryview | None = None
        self._filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._paused = False
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[Any] | None = None
        self._lost = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.spill_limit = SPILL_LIMIT

    # ------------------------------------------------------------------ transport side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport has the Transport API without subclassing it
        self.transport = transport  # type: ignore[assignment]
        writer = asyncio.StreamWriter(transport, self, None, self._evloop)  # type: ignore[arg-type]
        self.task = self._evloop.create_task(self._handler(self, writer))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None and self._filled < len(self._target):
            return self._target[self._filled:]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None and self._filled < len(self._target):
            self._filled += nbytes
            if self._filled == len(self._target):
                self._wake()
            return
        self._spill += self._scratch[:nbytes]
        if len(self._spill) > self.spill_limit and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = self._lost = True
        self._wake()
        self._wake_drains()

    # Flow control of writes, what ``StreamWriter.drain`` awaits (``_drain_helper``). Not
    # asyncio's FlowControlMixin: subclassing ``Protocol`` makes uvloop treat this as a
    # plain protocol and never call ``get_buffer``.
    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drains()

    def _wake_drains(self) -> None:
        for f in self._drain_waiters:
            if not f.done():
                f.set_result(None)
        self._drain_waiters.clear()

    async def _drain_helper(self) -> None:
        if self._lost:
            raise ConnectionResetError("connection lost")
        if not self._write_paused:
            return
        fut = self._evloop.create_future()
        self._drain_waiters.append(fut)
        await fut
        if self._lost:
            raise ConnectionResetError("connection lost")

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _resume(self) -> None:
        if self._paused and self.transport is not None and len(self._spill) <= self.spill_limit:
            self._paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------------ reader side
    async def readinto(self, view: memoryview) -> None:
        """Fill ``view`` exactly (spilled bytes first, then straight from the socket)."""
        n, got = len(view), 0
        if self._spill:
            got = min(n, len(self._spill))
            view[:got] = self._spill[:got]
            del self._spill[:got]
            self._resume()
        if got == n:
            return
        if self._eof:
            raise asyncio.IncompleteReadError(bytes(view[:got]), n)
        self._target, self._filled = view, got
        self._waiter = self._evloop.create_future()
        self._resume()
        try:
            await self._waiter
        finally:
            filled, self._target, self._waiter = self._filled, None, None
        if filled < n:
            raise asyncio.IncompleteReadError(bytes(view[:filled]), n)

    async def readexactly(self, n: int) -> bytes:
        buf = bytearray(n)
        await self.readinto(memoryview(buf))
        return bytes(buf)
