"""``ByteGate``: a byte budget (``max_inflight_bytes`` for authenticated frames and
replies, ``auth_inflight_bytes`` for connections still before AUTH, one peer address's
share of the reply room), with the figures ``STATS`` reports."""

from __future__ import annotations

import asyncio


class ByteGate:
    """At most ``limit`` bytes held at once: ``acquire`` waits for room (a request larger
    than the limit waits until nothing else is held, then goes alone); ``charge`` takes
    room without waiting, for bytes that exist already (a reply larger than its
    reservation), so ``used`` can pass ``limit`` by those. ``give`` returns room at once
    (it never waits, so it is safe in cleanup after a cancellation); ``release`` is its
    awaitable form. ``peak``: the most ever held; ``waiting``: acquirers waiting now.
    Event loop only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = self.peak = self.waiting = 0
        self._woken: list[asyncio.Future[None]] = []

    def fits(self, n: int) -> bool:
        return self.used == 0 or self.used + n <= self.limit

    async def acquire(self, n: int) -> None:
        if not self.fits(n):
            self.waiting += 1
            try:
                while not self.fits(n):  # every release wakes all waiters to look again
                    wake = asyncio.get_running_loop().create_future()
                    self._woken.append(wake)
                    await wake
            finally:
                self.waiting -= 1
        self.charge(n)

    def charge(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def give(self, n: int) -> None:
        if n == 0:
            return
        self.used -= n
        woken, self._woken = self._woken, []
        for f in woken:
            if not f.done():
                f.set_result(None)

    async def release(self, n: int) -> None:
        self.give(n)
