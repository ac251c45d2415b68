"""Client sessions and the leases they hold.

A client process (one ``ServerCache``) is one session over one or more connections; the
leases it takes (``ACQUIRE``) are its own (another session cannot release or load through
them) and are released when its last connection closes, so a client that dies never
leaves objects locked in the index.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter

from hybrid_connector.cache import HybridCache
from hybrid_connector.index_core import Lease

Held = tuple[HybridCache, Lease]


class Sessions:
    """Session id -> leases and live connection count; thread safe."""

    def __init__(self) -> None:
        self._conns: Counter[str] = Counter()
        self._leases: dict[str, dict[int, Held]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def join(self, sid: str) -> None:
        with self._lock:
            self._conns[sid] += 1

    def leave(self, sid: str) -> list[Held]:
        """One connection of ``sid`` closed; the session's leases when it was the last."""
        with self._lock:
            self._conns[sid] -= 1
            if self._conns[sid] > 0:
                return []
            del self._conns[sid]
            return list(self._leases.pop(sid, {}).values())

    def add(self, sid: str, held: Held) -> int:
        with self._lock:
            lid = next(self._ids)
            self._leases.setdefault(sid, {})[lid] = held
            return lid

    def get(self, sid: str, lid: int) -> Held | None:
        with self._lock:
            return self._leases.get(sid, {}).get(lid)

    def take(self, sid: str, lid: int) -> Held | None:
        with self._lock:
            return self._leases.get(sid, {}).pop(lid, None)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"sessions": len(self._conns), "connections": sum(self._conns.values()),
                    "leases": sum(len(v) for v in self._leases.values())}
