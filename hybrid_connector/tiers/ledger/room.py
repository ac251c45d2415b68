"""How the ledger makes room in a local tier (mixed into ``hybrid_connector.tiers.ledger.ledger.Ledger``, which
owns the state): pick victims, demote them down the local tiers, move them off the local
tiers to the shared one, or drop them. See ``hybrid_connector.tiers.ledger.ledger`` for the rules.
Only the ledger's public methods call these, with the ledger's lock held."""

from __future__ import annotations

from collections.abc import Callable

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ledger.records import Entry, TierUsage
from hybrid_connector.tiers.ledger.value import ValueFn, lowest_value, worth_keeping
from hybrid_connector.tiers.ops import Move, Op, Remove


class Room:
    """Room making over the ``Ledger``'s state (declared here, set by ``Ledger``)."""

    _local: list[TierUsage]
    _shared: TierUsage | None
    entries: dict[ObjectKey, Entry]
    merits: Callable[[ObjectKey], bool] | None
    value: ValueFn | None
    value_window: int
    clock: int
    drops_with_room: int  # evictions dropped while a tier below could take them

    def _forget(self, key: ObjectKey) -> Entry:
        raise NotImplementedError

    def _victim(self, t: TierUsage, kind: ObjectKind, exclude: set[ObjectKey]) -> ObjectKey | None:
        pool = t.spec.kind_pool.get(kind)
        if self.value_window and self.value is not None and not t.spec.shared:
            return lowest_value(t, self.entries, pool, exclude, self.value, self.clock,
                                self.value_window, self._local)
        return t.oldest(self.entries, pool, exclude)

    def _make_room(self, i: int, kind: ObjectKind, nbytes: int, ops: list[Op],
                   dropped: list[ObjectKey], exclude: set[ObjectKey]) -> bool:
        t = self._local[i]
        while not t.fits(kind, nbytes):
            victim = self._victim(t, kind, exclude)
            if victim is None:
                return False
            self._evict(i, victim, ops, dropped, exclude)
        return True

    def _evict(self, i: int, key: ObjectKey, ops: list[Op], dropped: list[ObjectKey],
               exclude: set[ObjectKey]) -> None:
        """Move ``key`` out of local tier ``i``: down if it merits and fits, else off the
        local tiers (kept as shared-only, moved to the shared tier when it has no copy
        there, else dropped)."""
        e = self.entries[key]
        src = self._local[i]
        merits = self.merits is None or self.merits(key)
        for j in range(i + 1, len(self._local)):
            dst = self._local[j]
            if not merits or not dst.holds(key.kind, e.nbytes) or not self._worth(e, dst):
                continue
            if self._make_room(j, key.kind, e.nbytes, ops, dropped, exclude | {key}):
                src.free(key, e.nbytes)
                dst.charge(key, e.nbytes)
                e.tier, e.last = dst.spec.name, self.clock  # its age in the new tier: 0
                ops.append(Move(key, src.spec.name, dst.spec.name))
                return
        src.free(key, e.nbytes)
        e.tier = None
        had_copy, sh = e.shared, self._shared
        if self._keep_shared(e, dropped, exclude, copy=True) and sh is not None:
            if not had_copy:  # its shared put failed (the remote was down): copy it now
                e.shared = True
            ops.append(Remove(key, src.spec.name) if had_copy
                       else Move(key, src.spec.name, sh.spec.name))
            return
        below = [t for t in self._local[i + 1:] if merits] + ([sh] if sh else [])
        self.drops_with_room += any(t.fits(key.kind, e.nbytes) and self._worth(e, t)
                                    for t in below)
        ops.append(Remove(key, src.spec.name))
        self._forget(key)
        dropped.append(key)

    def _worth(self, e: Entry, dst: TierUsage) -> bool:
        return worth_keeping(self.value, self.value_window, e, dst.spec.name, self.clock)

    def _keep_shared(self, e: Entry, dropped: list[ObjectKey], exclude: set[ObjectKey],
                     copy: bool = False) -> bool:
        """``e`` left the local tiers: track it as shared-only when it has a shared copy
        (``copy``: or its bytes are still here to copy there) and there is room for it."""
        sh = self._shared
        if ((e.shared or copy) and sh is not None and sh.holds(e.key.kind, e.nbytes)
                and self._worth(e, sh)
                and self._room_shared(e.key.kind, e.nbytes, dropped, exclude | {e.key})):
            sh.charge(e.key, e.nbytes)
            return True
        return False

    def _keep_shared_or_drop(self, e: Entry, dropped: list[ObjectKey],
                             exclude: set[ObjectKey]) -> None:
        """``_keep_shared``, else forget ``e`` (reported in ``dropped``)."""
        if not self._keep_shared(e, dropped, exclude):
            self._forget(e.key)
            dropped.append(e.key)

    def _room_shared(self, kind: ObjectKind, nbytes: int, dropped: list[ObjectKey],
                     exclude: set[ObjectKey]) -> bool:
        """Room to track ``nbytes`` more shared-only objects: forget the oldest ones (no op:
        the shared copies stay for whoever else uses them)."""
        sh = self._shared
        assert sh is not None
        while not sh.fits(kind, nbytes):
            victim = self._victim(sh, kind, exclude)
            if victim is None:
                return False
            sh.free(victim, self._forget(victim).nbytes)
            dropped.append(victim)
        return True
