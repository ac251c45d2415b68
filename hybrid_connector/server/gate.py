"""``ByteGate``: a byte budget shared by a server's connections (``max_inflight_bytes`` for
authenticated frames and replies, ``auth_inflight_bytes`` for connections still before
AUTH), with the figures ``STATS`` reports."""

from __future__ import annotations

import asyncio


class ByteGate:
    """At most ``limit`` bytes held at once: ``acquire`` waits for room (a request larger
    than the limit waits until nothing else is held, then goes alone); ``charge`` takes
    room without waiting, for bytes that exist already (a reply larger than its
    reservation), so ``used`` can pass ``limit`` by those. ``peak``: the most ever held;
    ``waiting``: acquirers waiting now."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = self.peak = self.waiting = 0
        self._cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._cond:
            self.waiting += 1
            try:
                await self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            finally:
                self.waiting -= 1
            self.charge(n)

    def charge(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    async def release(self, n: int) -> None:
        if n == 0:
            return
        async with self._cond:
            self.used -= n
            self._cond.notify_all()
