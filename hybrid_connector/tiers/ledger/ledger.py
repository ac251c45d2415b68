"""The ledger: which tier holds each object, per-tier per-kind budgets, and every placement
decision (where a new object goes, what is demoted or dropped to make room). Metadata only,
run where the index runs; the bytes live in worker processes, which carry out the
``hybrid_connector.tiers.ops`` it emits (every TP rank runs the same ops on its shard), so the ledger is the
one truth of what is where.

* Local tiers are exclusive. A new object goes to the fastest local tier whose pool for its
  kind can hold it, making room by moving that pool's least recently used, unpinned, ready
  objects down: a victim is demoted to the next tier that can hold it when ``merits(key)``
  agrees (making room there recursively), else it leaves the local tiers: kept as
  shared-only when a copy sits on the shared tier, moved there when it has none (its
  shared put failed: the remote was down) and the shared budget has room, else dropped
  (``dropped``: the index forgets it). A drop while a tier below had room is a defect
  (``drops_with_room``, asserted zero by ``check``). With a
  value window (``value_window`` > 0, ``tier_eviction: value``) the victim is the lowest
  value per byte of the pool's oldest candidates and it goes down only where loading it
  beats recomputing it (``hybrid_connector.tiers.ledger.value``).
* The shared tier (a remote store other instances use too) gets a copy of everything, is
  never removed from, and its budget only bounds how many shared-only objects are tracked.
* A budget may be shared by several kinds (``TierSpec.kind_pool``, ``kv_state`` in the
  config): their bytes together never exceed it, each kind takes what the others leave,
  and room for one is made by evicting any of them (the index asks its eviction policy
  which kind gives up bytes, ``room_kinds``; within a tier the ledger demotes the pool's
  least recently used object, whatever its kind). With one pool per kind, anchor or state
  pressure never evicts KV. Pending objects count
  against budgets and are never victims; pinned objects are never moved or dropped.

Thread safety: every public method takes the ledger's own re-entrant ``lock``; a caller
that needs several calls to see one state (or reads ``entries``) holds ``lock`` around
them. The ``merits`` and ``value`` hooks run with it held, so they must not take a lock an
index holds while calling the ledger (the index's hooks read its state lock free).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ledger.check import check_ledger
from hybrid_connector.tiers.ledger.records import (
    Entry,
    Placement,
    TierSpec,
    TierUsage,
    kind_limits,
    pool_groups,
    pool_totals,
)
from hybrid_connector.tiers.ledger.room import Room
from hybrid_connector.tiers.ledger.value import ValueFn
from hybrid_connector.tiers.ops import Op, Put, Remove, Take

__all__ = ["Entry", "Ledger", "Merits", "Placement", "Settled", "TierSpec", "ValueFn"]

Merits = Callable[[ObjectKey], bool]


class Settled(NamedTuple):
    """What ``Ledger.settle`` tells of an object after one of its puts reported."""

    usable: bool  # still in the ledger (else forgotten: the put left no copy to read)
    loadable: bool  # ``where`` names a tier now
    placed: str | None  # the local tier its entry sat in before the report


class Ledger(Room):
    """Budgets and locations of every object; see the module docstring."""

    def __init__(self, specs: Sequence[TierSpec], merits: Merits | None = None,
                 value: ValueFn | None = None, value_window: int = 0) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if sum(s.shared for s in specs) > 1:
            raise ValueError("at most one shared tier")
        self.lock = threading.RLock()  # guards everything below (see the module docstring)
        self.merits = merits
        self.value, self.value_window = value, value_window  # window 0: LRU tiers
        self.clock = 0  # ticks per place and touch: the age ``value`` is asked with
        self._local = [TierUsage(s) for s in specs if not s.shared]
        shared = [TierUsage(s) for s in specs if s.shared]
        self._shared = shared[0] if shared else None
        self._by_name = {t.spec.name: t for t in [*self._local, *shared]}
        self.entries: dict[ObjectKey, Entry] = {}
        # budget group (kinds sharing a pool in some tier) -> bytes over all tiers, and the
        # coarsest allocation unit of its pools
        self._groups = pool_groups(self.specs)
        self._budget, self._grain = pool_totals(self.specs)
        self._tracked: dict[str, int] = {}  # budget group -> bytes of the entries in it
        self._kind_used = dict.fromkeys(ObjectKind, 0)
        self._max_object, self._room = kind_limits(self.specs)
        self.drops_with_room = 0  # evictions dropped while a tier below could take them

    # ------------------------------------------------------------------ queries
    @property
    def specs(self) -> list[TierSpec]:
        return [t.spec for t in self._by_name.values()]

    @property
    def shared_tier(self) -> str | None:
        return self._shared.spec.name if self._shared else None

    def where(self, key: ObjectKey) -> str | None:
        """The tier to read ``key`` from (its local tier, else the shared tier when a copy
        is confirmed there), or None (absent or not yet written)."""
        with self.lock:
            e = self.entries.get(key)
            if e is None or e.pending or e.tier is not None:
                return None if e is None or e.pending else e.tier
            return self._shared.spec.name if self._shared and e.shared and not e.shared_pending else None

    def is_pending(self, key: ObjectKey) -> bool:
        with self.lock:
            return (e := self.entries.get(key)) is not None and e.pending

    def knows(self, key: ObjectKey) -> bool:
        """Is ``key`` in the ledger (pending or ready, in any tier)?"""
        with self.lock:
            return key in self.entries

    def _tiers(self) -> list[TierUsage]:
        return [*self._local, *([self._shared] if self._shared else [])]

    def capacity(self, kind: ObjectKind) -> int:
        """Bytes of ``kind`` the ledger tracks at most (every tier's pool of that kind)."""
        with self.lock:
            return sum(t.spec.budget(kind) for t in self._tiers())

    def used(self, kind: ObjectKind) -> int:
        """Bytes of ``kind`` tracked now (pending included), whatever tier they sit in."""
        with self.lock:
            return self._kind_used[kind]

    def max_object_bytes(self, kind: ObjectKind) -> int:
        """The largest object of ``kind`` any one tier's pool could hold (specs are fixed)."""
        with self.lock:
            return self._max_object[kind]

    def room_kinds(self, kind: ObjectKind) -> tuple[ObjectKind, ...]:
        """``kind`` and the kinds sharing a pool with it in some tier (evicting them makes
        room for it)."""
        with self.lock:
            return self._room[kind]

    def fits(self, pending: Mapping[ObjectKind, int]) -> bool:
        """Whether ``pending`` more bytes per kind fit in the tiers' pools together (budget
        group by group over all tiers: kinds sharing a pool are checked against their one
        budget; placement may still have to demote to find the room)."""
        with self.lock:
            need = dict(self._tracked)
            for kind, n in pending.items():
                if n:
                    pool = self._pool_name(kind)
                    need[pool] = need.get(pool, 0) + self._charged(pool, n)
            return all(n <= self._budget.get(pool, 0) for pool, n in need.items())

    def _add(self, e: Entry) -> None:
        self.entries[e.key] = e
        pool = self._pool_name(e.key.kind)
        self._tracked[pool] = self._tracked.get(pool, 0) + self._charged(pool, e.nbytes)
        self._kind_used[e.key.kind] += e.nbytes

    def _forget(self, key: ObjectKey) -> Entry:
        e = self.entries.pop(key)
        pool = self._pool_name(key.kind)
        self._tracked[pool] -= self._charged(pool, e.nbytes)
        self._kind_used[key.kind] -= e.nbytes
        return e

    def _charged(self, pool: str, nbytes: int) -> int:
        g = self._grain.get(pool, 1)
        return (max(nbytes, 1) + g - 1) // g * g

    def _pool_name(self, kind: ObjectKind) -> str:
        """``kind``'s budget group over the tiers (``pool_groups``)."""
        return self._groups[kind]

    def held(self, tier: str | None = None) -> list[ObjectKey]:
        """Keys held (ready) in ``tier`` (all tiers when None), least recently used first."""
        with self.lock:
            tiers = self._tiers() if tier is None else [self._by_name[tier]]
            return [k for t in tiers for k in t.lru if not self.entries[k].pending]

    # ------------------------------------------------------------------ placement
    def place(self, key: ObjectKey, nbytes: int, replace: bool = False) -> Placement:
        """Reserve room for a new object (pending until ``commit``): ops to make room, then a
        ``Put`` to the chosen local tier and, with a shared tier, a ``Put`` of the copy
        there. ``replace``: what the ledger still lists of ``key`` is removed first (those
        ops come first); else raises KeyError when ``key`` is already in the ledger."""
        with self.lock:
            ops: list[Op] = []
            if key in self.entries:
                if not replace:
                    raise KeyError(f"{key} is already placed")
                ops += self.remove(key)
            dropped: list[ObjectKey] = []
            exclude = {key}
            self.clock += 1
            for i, t in enumerate(self._local):
                if t.holds(key.kind, nbytes) and self._make_room(i, key.kind, nbytes, ops,
                                                                         dropped, exclude):
                    copy = self._shared is not None
                    self._add(Entry(key, nbytes, t.spec.name, shared=copy, shared_pending=copy,
                                    last=self.clock))
                    t.charge(key, nbytes)
                    ops.append(Put(key, t.spec.name))
                    if self._shared is not None:
                        ops.append(Put(key, self._shared.spec.name))
                    return Placement(t.spec.name, tuple(ops), tuple(dropped))
            sh = self._shared
            if sh is not None and sh.holds(key.kind, nbytes) and self._room_shared(
                    key.kind, nbytes, dropped, exclude):
                self._add(Entry(key, nbytes, None, shared=True, shared_pending=True))
                sh.charge(key, nbytes)
                ops.append(Put(key, sh.spec.name))
                return Placement(sh.spec.name, tuple(ops), tuple(dropped))
            return Placement(None, tuple(ops), tuple(dropped))

    def commit(self, key: ObjectKey, ok: bool, shared: bool = False) -> bool:
        """Outcome of one of a placed object's puts: its local copy, or (``shared``) its
        copy on the shared tier. Returns whether the object is still usable; when it is
        not, the ledger forgot it (a failed put leaves no bytes behind). A failed local put
        with a shared copy in flight leaves a shared-only object, pending until that put
        reports."""
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                return False
            if shared:
                e.shared, e.shared_pending = ok, False
                if e.tier is None:
                    if not ok:
                        self._drop_shared_only(e)
                        return False
                    e.pending = False
                return True
            if e.tier is not None and not ok:
                t = self._by_name[e.tier]
                t.free(key, e.nbytes)
                e.tier = None
                if e.shared and self._shared is not None:
                    self._shared.charge(key, e.nbytes)  # tracked there until its put reports
                    return True
                self._forget(key)
                return False
            if e.tier is not None:
                e.pending = False
            return True

    def settle(self, key: ObjectKey, ok: bool, shared: bool = False) -> Settled:
        """``commit``, and in the same locked step what its caller needs next: whether the
        object is still usable, whether it can be read now (``where``), and the local tier
        its entry sat in before (None: none, or unknown)."""
        with self.lock:
            e = self.entries.get(key)
            placed = e.tier if e is not None else None
            usable = self.commit(key, ok, shared)
            return Settled(usable, self.where(key) is not None, placed)

    def _drop_shared_only(self, e: Entry) -> None:
        if self._shared is not None and e.key in self._shared.lru:
            self._shared.free(e.key, e.nbytes)
        self._forget(e.key)

    def adopt(self, key: ObjectKey, nbytes: int, tier: str) -> bool:
        """Account an object ``tier`` already holds (a warm restart) as ready; False
        (nothing recorded) when its pool has no room left."""
        with self.lock:
            t = self._by_name.get(tier)
            if t is None or key in self.entries or not t.fits(key.kind, nbytes):
                return False
            t.charge(key, nbytes)
            shared = t.spec.shared
            self._add(Entry(key, nbytes, None if shared else tier, shared=shared, pending=False))
            return True

    def adopt_shared(self, key: ObjectKey, nbytes: int) -> Placement:
        """Track an object another instance wrote to the shared tier as a ready shared-only
        entry, forgetting the oldest ones for room (``dropped``); ``tier`` None: no room."""
        with self.lock:
            sh = self._shared
            if sh is None or key in self.entries or not sh.holds(key.kind, nbytes):
                return Placement(None)
            dropped: list[ObjectKey] = []
            if not self._room_shared(key.kind, nbytes, dropped, {key}):
                return Placement(None, (), tuple(dropped))
            sh.charge(key, nbytes)
            self._add(Entry(key, nbytes, None, shared=True, pending=False))
            return Placement(sh.spec.name, (), tuple(dropped))

    # ------------------------------------------------------------------ lifecycle
    def remove(self, key: ObjectKey) -> tuple[Op, ...]:
        """Forget ``key`` (the index evicted it); the ops delete its local copy (a shared
        copy is left alone). Unknown keys: no ops."""
        with self.lock:
            if key not in self.entries:
                return ()
            e = self._forget(key)
            ops: tuple[Op, ...] = ()
            if e.tier is not None:
                self._by_name[e.tier].free(key, e.nbytes)
                ops = (Remove(key, e.tier),)
            if self._shared is not None and key in self._shared.lru:
                self._shared.free(key, e.nbytes)
            return ops

    def lost(self, key: ObjectKey, tier: str | None = None) -> Placement:
        """The copy in ``tier`` (default: the one reads use) is gone or bad: forget that
        copy, and the object when no copy is left (then in ``dropped``). The ops remove
        what may remain of a bad local copy."""
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                return Placement(None)
            tier = tier or self.where(key)
            sh = self._shared
            if sh is not None and tier == sh.spec.name:
                e.shared = False
                if e.tier is None:
                    self._drop_shared_only(e)
                    return Placement(None, (), (key,))
                return Placement(e.tier)
            if e.tier is None or e.tier != tier:
                return Placement(self.where(key))
            self._by_name[e.tier].free(key, e.nbytes)
            ops: tuple[Op, ...] = (Remove(key, e.tier),)
            e.tier = None
            dropped: list[ObjectKey] = []
            self._keep_shared_or_drop(e, dropped, set())
            return Placement(self.where(key), ops, tuple(dropped))

    def pin(self, keys: Iterable[ObjectKey], delta: int = 1) -> None:
        """Add ``delta`` pins to each known key (pinned objects are never moved or dropped)."""
        with self.lock:
            for k in keys:
                e = self.entries.get(k)
                if e is not None:
                    e.pins = max(0, e.pins + delta)

    def touch(self, keys: Iterable[ObjectKey]) -> None:
        """Mark the keys most recently used in their tier (one more hit each)."""
        with self.lock:
            self.clock += 1
            for k in keys:
                e = self.entries.get(k)
                if e is not None:
                    e.hits, e.last = e.hits + 1, self.clock
                t = self._by_name.get(e.tier) if e and e.tier else self._shared
                if t is not None and k in t.lru:
                    t.lru.move_to_end(k)

    def promote(self, key: ObjectKey) -> Placement:
        """Move a ready, unpinned object read from a slower tier into the fastest tier that
        can take it: ``Take`` it out of its tier first (so the demotions that make room may
        use what it leaves), then ``Put`` it up. No ops when nothing faster can take it."""
        with self.lock:
            e = self.entries.get(key)
            if e is None or e.pending or e.pins:
                return Placement(None)
            here = next((i for i, t in enumerate(self._local) if t.spec.name == e.tier),
                        len(self._local))
            targets = [i for i in range(here) if self._local[i].holds(key.kind, e.nbytes)]
            if not targets:
                return Placement(e.tier)
            src = e.tier or (self._shared.spec.name if self._shared else "")
            if e.tier is not None:
                self._by_name[e.tier].free(key, e.nbytes)
            elif self._shared is not None:
                self._shared.free(key, e.nbytes)
            e.tier = None
            ops: list[Op] = [Take(key, src)]
            dropped: list[ObjectKey] = []
            for i in targets:
                t = self._local[i]
                if self._make_room(i, key.kind, e.nbytes, ops, dropped, {key}):
                    t.charge(key, e.nbytes)
                    e.tier = t.spec.name
                    ops.append(Put(key, t.spec.name))
                    return Placement(t.spec.name, tuple(ops), tuple(dropped))
            # No room after all (everything pinned): put it back where it was.
            back = self._by_name.get(src)
            if back is not None and not back.spec.shared and back.fits(key.kind, e.nbytes):
                back.charge(key, e.nbytes)
                e.tier = src
                ops.append(Put(key, src))
            else:
                self._keep_shared_or_drop(e, dropped, {key})
            return Placement(e.tier, tuple(ops), tuple(dropped))

    def check(self) -> None:
        """Raise AssertionError if usage or tracked bytes are off (``hybrid_connector.tiers.ledger.check``)
        or an eviction dropped an object a tier below had room for."""
        with self.lock:
            assert not self.drops_with_room, f"{self.drops_with_room} drops with room below"
            check_ledger(self.entries, self._tiers(), self._shared, self._pool_name,
                         self._charged, self._tracked)
