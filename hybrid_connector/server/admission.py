"""Which connections a server keeps: caps on connections open at once (all of them, per
peer address, and those not authenticated yet) and the tallies ``STATS`` reports.

A connection over ``max_connections`` (kept below the process's open-files limit, so the
listener never runs out of descriptors) or ``max_connections_per_peer`` first closes the
oldest connection still waiting to authenticate (in the same set); when there is none it
is refused: closed at once, with a warning naming the cap (at most one line a second, the
next one counting those not logged). A new unauthenticated connection beyond
``max_unauthenticated`` closes the oldest unauthenticated one, so connections that never
authenticate cannot keep a client that does from getting in: a real client sends AUTH
right after connecting and leaves the pending set within a round trip.
"""

from __future__ import annotations

import logging
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hybrid_connector.core.config_server import ServerSettings

log = logging.getLogger(__name__)
LOG_EVERY_S = 1.0


def files_limit() -> int | None:
    """The process's soft open-files limit (None: unlimited or unknown)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(configured: int, files: int | None) -> int:
    """``configured``, kept below ``files`` by a reserve for the store's own files, the
    listeners and the event loop (64 plus an eighth of the limit)."""
    if files is None:
        return configured
    return max(1, min(configured, files - 64 - files // 8))


@dataclass(eq=False)
class Link:
    """One admitted connection. ``close`` aborts it; ``admin``: authenticated with
    ``admin_token``."""

    peer: str
    close: Callable[[], None]
    authed: bool
    admin: bool = False
    since: float = field(default_factory=time.monotonic)


class Admission:
    """The connections a ``Handler`` serves (see the module docstring). Event loop only."""

    def __init__(self, s: ServerSettings, files: int | None = None) -> None:
        self.s = s
        files = files_limit() if files is None else files
        self.cap = connection_cap(s.max_connections, files)
        if self.cap < s.max_connections:
            log.warning("server.max_connections %d lowered to %d: the open-files limit is %s "
                        "(raise it with ulimit -n)", s.max_connections, self.cap, files)
        self.links: dict[Link, None] = {}  # insertion order: oldest first
        self.pending: dict[Link, None] = {}  # not authenticated yet, oldest first
        self.per_peer: Counter[str] = Counter()
        self.refused = self.evicted = self.auth_timeouts = 0
        self._logged_at = float("-inf")
        self._unlogged = 0

    def admit(self, peer: str, close: Callable[[], None], authed: bool) -> Link | None:
        """The new connection's ``Link``, or None when it is refused (the caller closes it)."""
        if not authed and len(self.pending) >= self.s.max_unauthenticated:
            self._evict(next(iter(self.pending)))
            self._warn(f"closed the oldest connection not authenticated yet for one from "
                       f"{peer}: {len(self.pending) + 1} waiting to authenticate, the cap "
                       f"server.max_unauthenticated = {self.s.max_unauthenticated}")
        if len(self.links) >= self.cap and not self._evict_oldest(None):
            self._refuse(peer, "max_connections", self.cap, len(self.links))
            return None
        if (self.per_peer[peer] >= self.s.max_connections_per_peer
                and not self._evict_oldest(peer)):
            self._refuse(peer, "max_connections_per_peer", self.s.max_connections_per_peer,
                         self.per_peer[peer])
            return None
        link = Link(peer, close, authed)
        self.links[link] = None
        self.per_peer[peer] += 1
        if not authed:
            self.pending[link] = None
        return link

    def authenticated(self, link: Link, admin: bool) -> None:
        link.authed, link.admin = True, admin
        self.pending.pop(link, None)

    def timed_out(self, link: Link) -> None:
        """``link`` missed ``auth_timeout_s`` (its handler closes it)."""
        self.auth_timeouts += 1
        self.leave(link)

    def leave(self, link: Link) -> None:
        """``link`` closed (idempotent)."""
        if self.links.pop(link, 0) is None:
            self.per_peer[link.peer] -= 1
            if self.per_peer[link.peer] <= 0:
                del self.per_peer[link.peer]
        self.pending.pop(link, None)

    def _evict_oldest(self, peer: str | None) -> bool:
        victim = next((k for k in self.pending if peer is None or k.peer == peer), None)
        if victim is None:
            return False
        self._evict(victim)
        return True

    def _evict(self, link: Link) -> None:
        self.evicted += 1
        self.leave(link)
        link.close()

    def _refuse(self, peer: str, key: str, cap: int, n_open: int) -> None:
        self.refused += 1
        self._warn(f"refused a connection from {peer}: {n_open} open, at the cap "
                   f"server.{key} = {cap} (none waiting to authenticate to close instead)")

    def _warn(self, line: str) -> None:
        """``line`` as a warning, at most one a second (the next counts those dropped)."""
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} such lines not logged before this one)" if self._unlogged else ""
        log.warning("%s%s", line, more)
        self._logged_at, self._unlogged = now, 0

    def counts(self) -> dict[str, int]:
        return {"open": len(self.links), "unauthenticated": len(self.pending),
                "cap": self.cap, "refused": self.refused, "evicted": self.evicted,
                "auth_timeouts": self.auth_timeouts}
