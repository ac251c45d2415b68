"""Room for replies under ``max_inflight_bytes``: the server counts the bytes of a reply
from before it is made until it has drained to the client.

A reply that can be large waits for room for the most it can be before it is made (a plain
GET: ``max_object_bytes``; a LOAD: the sizes its plan names) and gives back what it does
not use once made; every other reply is charged its size when made, without waiting (it
exists already). The room goes back once the reply has drained: the transport holds at
most its high-water mark of it then. A client that does not read therefore holds its one
reply's room (its connection answers one frame at a time) until the drain deadline cuts
it, and the next replies wait for room instead of piling up in memory.
"""

from __future__ import annotations

import asyncio

import msgspec

from hybrid_connector.server.gate import ByteGate
from hybrid_connector.wire import messages as m

_LOAD = msgspec.msgpack.Decoder(m.Load)


def load_bound(message: memoryview, limit: int) -> int:
    """The payload bytes a LOAD's plan names (0 when it does not decode: it is refused),
    at most ``limit``."""
    try:
        plan = _LOAD.decode(message).plan
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0
    objs = [*plan.kv, *plan.anchors, *((plan.state,) if plan.state is not None else ())]
    return min(limit, sum(max(0, o.nbytes) for o in objs))


class Room:
    """Reply bytes in flight over all connections (``used``, ``peak``) under ``gate``."""

    def __init__(self, gate: ByteGate) -> None:
        self.gate = gate
        self.used = self.peak = 0

    def hold(self) -> Hold:
        """One reply's room (none yet)."""
        return Hold(self)

    def _add(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)


class Hold:
    """The room one reply holds: ``reserve`` before making it, ``fit`` once made,
    ``release`` once drained (or the connection is gone)."""

    def __init__(self, room: Room) -> None:
        self.room = room
        self.n = 0

    async def reserve(self, n: int, timeout: float) -> None:
        """Wait (at most ``timeout`` s: ``TimeoutError``) for ``n`` more bytes of room."""
        if n > 0:
            await asyncio.wait_for(self.room.gate.acquire(n), timeout)
            self.n += n
            self.room._add(n)

    async def fit(self, size: int) -> None:
        """The reply is ``size`` bytes: give back the rest, or take the excess at once."""
        if size > self.n:
            self.room.gate.charge(size - self.n)
            self.room._add(size - self.n)
        elif size < self.n:
            await self.room.gate.release(self.n - size)
            self.room.used -= self.n - size
        self.n = size

    async def release(self) -> None:
        n, self.n = self.n, 0
        self.room.used -= n
        await self.room.gate.release(n)
