"""Room for replies under ``max_inflight_bytes``: the server counts the bytes of a reply
from before it is made until it has drained to the client.

A reply that can be large waits for room for the most it can be before it is made (a plain
GET: ``max_object_bytes``; a LOAD: the sizes its plan names) and gives back what it does
not use once made; every other reply is charged its size when made, without waiting (it
exists already). The room goes back once the reply has drained: the transport holds at
most its high-water mark of it then. A client that does not read therefore holds its one
reply's room (its connection answers one frame at a time) until the drain deadline cuts
it, and the next replies wait for room instead of piling up in memory.

Each peer address has a share of the room (``reply_share``, ``max_reply_bytes_per_peer``):
a reply first waits for room within its address's share, then in the whole room, so the
replies one address does not read wait on their own and never take the room the other
addresses need. A connection answers one frame at a time, so it holds at most one reply's
room: its share is that one reply.
"""

from __future__ import annotations

import asyncio

import msgspec

from hybrid_connector.remote.wire import messages as m
from hybrid_connector.server.gate import ByteGate

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
    """Reply bytes in flight over all connections (``used``, ``peak``) under ``gate``, and
    per peer address under ``share`` bytes each (``join``/``leave``: its connections)."""

    def __init__(self, gate: ByteGate, share: int) -> None:
        self.gate = gate
        self.share = share
        self.used = self.peak = 0
        self._peers: dict[str, tuple[ByteGate, int]] = {}  # address -> (its share, conns)

    def join(self, peer: str) -> ByteGate:
        """A connection from ``peer`` opened: its address's share (made on first use)."""
        gate, n = self._peers.get(peer, (None, 0))
        if gate is None:
            gate = ByteGate(self.share)
        self._peers[peer] = (gate, n + 1)
        return gate

    def leave(self, peer: str) -> None:
        """A connection from ``peer`` closed (after its reply's room went back)."""
        gate, n = self._peers[peer]
        if n > 1:
            self._peers[peer] = (gate, n - 1)
        else:
            del self._peers[peer]

    def share_of(self, peer: str) -> ByteGate:
        """The share of ``peer`` (one of its connections is open)."""
        return self._peers[peer][0]

    @property
    def waiting(self) -> int:
        """Replies waiting for room in their address's share."""
        return sum(g.waiting for g, _ in self._peers.values())

    def hold(self, share: ByteGate | None = None) -> Hold:
        """One reply's room (none yet), within ``share`` when given."""
        return Hold(self, share)

    def _add(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)


class Hold:
    """The room one reply holds: ``reserve`` before making it, ``fit`` once made,
    ``release`` once drained (or the connection is gone)."""

    def __init__(self, room: Room, share: ByteGate | None = None) -> None:
        self.room = room
        self.share = share
        self.n = 0

    def _gates(self) -> list[ByteGate]:
        return [self.room.gate] if self.share is None else [self.share, self.room.gate]

    async def reserve(self, n: int, timeout: float) -> None:
        """Wait (at most ``timeout`` s: ``TimeoutError``) for ``n`` more bytes of room:
        first in the peer's share, then in the whole room."""
        if n > 0:
            await asyncio.wait_for(self._take(n), timeout)
            self.n += n
            self.room._add(n)

    async def _take(self, n: int) -> None:
        taken: list[ByteGate] = []
        try:
            for g in self._gates():
                await g.acquire(n)
                taken.append(g)
        except BaseException:  # cancelled (deadline) or gone: give back what it took
            for g in taken:
                g.give(n)
            raise

    async def fit(self, size: int) -> None:
        """The reply is ``size`` bytes: give back the rest, or take the excess at once."""
        for g in self._gates():
            if size > self.n:
                g.charge(size - self.n)
            elif size < self.n:
                g.give(self.n - size)
        self.room._add(size - self.n)
        self.n = size

    async def release(self) -> None:
        n, self.n = self.n, 0
        self.room.used -= n
        for g in self._gates():
            g.give(n)
