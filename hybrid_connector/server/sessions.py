"""Client sessions and the leases they hold.

A client process (one ``ServerCache``) is one session over one or more connections; the
leases it takes (``ACQUIRE``) are its own (another session cannot release or load through
them) and are released when its last connection closes, so a client that dies never
leaves objects locked in the index. Bounds (``ServerSettings``), so that no session locks
what the others need:

* a lease lives ``lease_lifetime_s`` from its ACQUIRE, then ``expired`` hands it back for
  release (a LOAD reading through it keeps it until that read is done); a LOAD or RELEASE
  through an expired lease is refused like an unknown one;
* a session holds at most ``max_leases_per_session`` leases (``LeaseRefused`` beyond);
* the distinct objects a session's leases pin take at most ``max_pinned_fraction`` of any
  budget pool (a kind's pool summed over the local tiers: a save that finds a pool's fast
  tier pinned full goes a tier down), ``LeaseRefused`` beyond; so one session never pins a
  whole budget and other clients' saves always find evictable room.

A lease also records the server's own size and tier of every object it covers, read from
the ledger when it is acquired: a LOAD reads with those, never with what the client sends.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from hybrid_connector.core.config_server import ServerSettings
from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.index.plan import LoadPlan, PlannedObject
from hybrid_connector.index.state import Lease
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.tiers.ledger.records import pool_groups
from hybrid_connector.tree.radix import ObjectRef

Pool = str  # a budget pool's name (``TierSpec.kind_pool``)
Cost = tuple[Pool, int] | None  # the room an object takes, None: no local room
BUSY_RETRY_S = 1.0  # an expired lease a LOAD is reading through is looked at again after this


class LeaseRefused(Exception):
    """An ACQUIRE beyond a session's bounds; the message names the bound."""


@dataclass
class Held:
    """One lease of a session: its model, the index's lease, the server's view of each
    object it covers (size and tier at ACQUIRE), when it expires, LOADs reading through it."""

    cache: HybridCache
    lease: Lease
    objects: dict[ObjectKey, PlannedObject]
    expires: float
    busy: int = 0


@dataclass
class _Session:
    conns: int = 0
    leases: dict[int, Held] = field(default_factory=dict)
    keys: Counter[ObjectKey] = field(default_factory=Counter)  # leases holding each key
    cost: dict[ObjectKey, Cost] = field(default_factory=dict)
    pinned: Counter[Pool] = field(default_factory=Counter)  # bytes of distinct keys


class Sessions:
    """Session id -> connections and leases, under the bounds above; thread safe.
    ``clock``: monotonic seconds (tests may inject one)."""

    def __init__(self, settings: ServerSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime = settings.lease_lifetime_s
        self.max_leases = settings.max_leases_per_session
        self.fraction = settings.max_pinned_fraction
        self.clock = clock
        self._sessions: dict[str, _Session] = {}
        self._expiry: list[tuple[float, int, str]] = []  # heap of (expires, lease id, sid)
        self._ids = itertools.count(1)
        self._live = 0  # leases held, all sessions
        self._lock = threading.Lock()

    def join(self, sid: str) -> None:
        with self._lock:
            self._sessions.setdefault(sid, _Session()).conns += 1

    def leave(self, sid: str) -> list[Held]:
        """One connection of ``sid`` closed; the session's leases when it was the last."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                return []
            s.conns -= 1
            if s.conns > 0:
                return []
            del self._sessions[sid]
            self._live -= len(s.leases)
            self._compact()
            return list(s.leases.values())

    def acquire(self, sid: str, cache: HybridCache, plan: LoadPlan) -> int | None:
        """Lock ``plan`` for ``sid``: the lease id, None when the plan went stale (see
        ``CacheIndex.acquire``); ``LeaseRefused`` beyond the session's bounds."""
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                raise LeaseRefused("the session has no open connection")
            if len(s.leases) >= self.max_leases:
                raise LeaseRefused(f"this session holds {len(s.leases)} leases, "
                                   f"server.max_leases_per_session: release some first")
            lease = cache.acquire(plan)
            if lease is None:
                return None
            objects, cost, limits = self._server_view(cache, lease)
            over = self._over(s, cost, limits) if objects is not None else "gone"
            if objects is None or over:
                cache.release(lease)
                if objects is None:
                    return None
                raise LeaseRefused(over)
            lid = next(self._ids)
            expires = self.clock() + self.lifetime
            s.leases[lid] = Held(cache, lease, objects, expires)
            self._live += 1
            for k in set(lease.keys):
                if s.keys[k] == 0:
                    s.cost[k] = cost[k]
                    c = cost[k]
                    if c is not None:
                        s.pinned[c[0]] += c[1]
                s.keys[k] += 1
            heapq.heappush(self._expiry, (expires, lid, sid))
            return lid

    @staticmethod
    def _server_view(cache: HybridCache, lease: Lease) -> tuple[
            dict[ObjectKey, PlannedObject] | None, dict[ObjectKey, Cost], dict[Pool, int]]:
        """Each leased object's size and tier per the ledger (None: one left the store),
        its pool and the bytes it takes there (None: only a shared-tier copy, which takes
        no local room), and every pool's budget over the local tiers."""
        store = cache.store
        objects: dict[ObjectKey, PlannedObject] = {}
        cost: dict[ObjectKey, Cost] = {}
        with store.lock:
            specs = {sp.name: sp for sp in store.ledger.specs}
            local = [sp for sp in specs.values() if not sp.shared]
            # kinds sharing a pool in some tier (a host kv_state pool) are one budget over
            # the local tiers, whichever tier's pool an object sits in
            groups = pool_groups(local)
            for k in set(lease.keys):
                e, tier = store.ledger.entries.get(k), store.ledger.where(k)
                if e is None or tier is None:
                    return None, {}, {}
                objects[k] = PlannedObject(ObjectRef(k, e.nbytes), tier)
                sp = specs.get(e.tier) if e.tier is not None else None
                pool = sp.kind_pool.get(k.kind) if sp is not None else None
                cost[k] = None if sp is None or pool is None else (
                    groups[k.kind], sp.size(k.kind, e.nbytes))
        limits: Counter[Pool] = Counter()
        for sp in local:
            for pool, kind in {p: k for k, p in sp.kind_pool.items()}.items():
                limits[groups[kind]] += int(sp.pools[pool])
        return objects, cost, dict(limits)

    def _over(self, s: _Session, cost: dict[ObjectKey, Cost], limits: dict[Pool, int]) -> str:
        """Why adding ``cost``'s keys new to ``s`` would put it over a pool's pinned share
        ("": it would not)."""
        extra: Counter[Pool] = Counter()
        for k, c in cost.items():
            if c is not None and s.keys[k] == 0:
                extra[c[0]] += c[1]
        for pool, n in extra.items():
            cap = self.fraction * limits.get(pool, 0)
            if s.pinned[pool] + n > cap:
                return (f"this session's leases would pin {s.pinned[pool] + n} B of the "
                        f"{pool} pool ({limits.get(pool, 0)} B over the local tiers), above "
                        f"server.max_pinned_fraction ({self.fraction}): release some first")
        return ""

    def checkout(self, sid: str, lid: int) -> Held | None:
        """``sid``'s lease ``lid``, kept from expiring until ``checkin``; None if unknown."""
        with self._lock:
            s = self._sessions.get(sid)
            held = s.leases.get(lid) if s is not None else None
            if held is not None:
                held.busy += 1
            return held

    def checkin(self, held: Held) -> None:
        with self._lock:
            held.busy -= 1

    def take(self, sid: str, lid: int) -> Held | None:
        """Remove ``sid``'s lease ``lid`` (for the caller to release); None if unknown."""
        with self._lock:
            s = self._sessions.get(sid)
            held = self._drop(s, lid) if s is not None else None
            self._compact()
            return held

    def expired(self) -> list[Held]:
        """Remove and return the leases past their lifetime (the caller releases them)."""
        now = self.clock()
        out: list[Held] = []
        with self._lock:
            while self._expiry and self._expiry[0][0] <= now:
                _, lid, sid = heapq.heappop(self._expiry)
                s = self._sessions.get(sid)
                held = s.leases.get(lid) if s is not None else None
                if held is None or s is None:
                    continue  # released already
                if held.busy:  # a LOAD is reading through it: look again shortly
                    heapq.heappush(self._expiry, (now + BUSY_RETRY_S, lid, sid))
                    continue
                self._drop(s, lid)
                out.append(held)
        return out

    def _drop(self, s: _Session, lid: int) -> Held | None:
        held = s.leases.pop(lid, None)
        if held is None:
            return None
        self._live -= 1
        for k in set(held.lease.keys):
            s.keys[k] -= 1
            if s.keys[k] <= 0:
                del s.keys[k]
                c = s.cost.pop(k, None)
                if c is not None:
                    s.pinned[c[0]] -= c[1]
        return held

    def _compact(self) -> None:
        """Rebuild the expiry heap when most of it is released leases (lock held)."""
        if len(self._expiry) > 2 * self._live + 64:
            self._expiry = [(h.expires, lid, sid) for sid, s in self._sessions.items()
                            for lid, h in s.leases.items()]
            heapq.heapify(self._expiry)

    def counts(self) -> dict[str, int]:
        with self._lock:
            ss = self._sessions.values()
            return {"sessions": len(self._sessions), "connections": sum(s.conns for s in ss),
                    "leases": sum(len(s.leases) for s in ss),
                    "pinned_bytes": sum(sum(s.pinned.values()) for s in ss)}
