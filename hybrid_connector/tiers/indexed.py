"""``IndexedTier``: the bookkeeping every concrete tier shares, on top of ``hybrid_connector.tiers.tier.Tier``.

One index per kind in LRU order, per-kind usage against the budgets, nested pins, and
deferred frees (an object removed or replaced while pinned is released at its last unpin).
A subclass supplies only the storage (``_store``, ``_load_into``, ``_release``); the
contract every tier keeps is in ``hybrid_connector.tiers.tier``'s module docstring.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers.tier import (
    Tier,
    TierRecord,
    TierStats,
    TierUnavailable,
    check_metas,
    check_payload,
    nbytes_of,
)

log = logging.getLogger(__name__)
# How long a put waits for room that removed objects still hold while a read copies them out:
# only the slab tiers (device, host) reserve storage, so the wait is for a memory copy.
ZOMBIE_WAIT_S = 5.0


@dataclass(slots=True)
class Admitted:
    """A put that passed validation and holds its reservation (``_admit`` to ``_commit``)."""

    key: ObjectKey
    payload: torch.Tensor
    meta: ObjectMeta | None
    nbytes: int
    token: object


class IndexedTier(Tier):
    """Shared bookkeeping: index, per-kind LRU order and usage, pins, deferred frees.

    Subclasses implement the storage: ``_store`` (write a payload, return a handle),
    ``_load_into`` (read a handle into a buffer), ``_release`` (free a handle). The index
    lock is never held during a subclass read, so reads of pinned objects run in parallel.
    """

    def __init__(self, name: str, budgets: Mapping[ObjectKind, int],
                 joint: Collection[ObjectKind] = ()) -> None:
        self.name = name
        self._budget = {k: int(budgets.get(k, 0)) for k in ObjectKind}
        for k, v in self._budget.items():
            if v < 0:
                raise ValueError(f"tier {name!r}: budget of {k.value} must be >= 0, got {v}")
        # ``joint``: kinds sharing one budget (each kind's ``budgets`` entry, all equal): a
        # put is checked against what all of them use together.
        self.joint = frozenset(joint) if len(set(joint)) > 1 else frozenset()
        if len({self._budget[k] for k in self.joint}) > 1:
            raise ValueError(f"tier {name!r}: kinds sharing a budget need one budget, got "
                             f"{ {k.value: self._budget[k] for k in self.joint} }")
        self._used = {k: 0 for k in ObjectKind}
        self._lru: dict[ObjectKind, OrderedDict[ObjectKey, TierRecord]] = {
            k: OrderedDict() for k in ObjectKind
        }
        self._lock = threading.RLock()
        self._freed = threading.Condition(self._lock)  # a pinned removed entry was released
        self._stats = TierStats(name)
        # Entries removed or replaced while pinned, released at their last unpin.
        self._zombies: dict[ObjectKey, list[TierRecord]] = {}
        # Puts in progress per key (storage named by key must not be freed under them).
        self._inflight: Counter[ObjectKey] = Counter()

    def _pool_used(self, kind: ObjectKind) -> int:
        """Bytes used of ``kind``'s budget (every kind sharing it, under the index lock)."""
        if kind in self.joint:
            return sum(self._used[k] for k in self.joint)
        return self._used[kind]

    # ---------------------------------------------------------------- storage hooks
    @abstractmethod
    def _store(self, key: ObjectKey, payload: torch.Tensor, token: object) -> object | None:
        """Write ``payload`` into the room ``token`` reserved; return its handle or None on
        failure. Called without the index lock."""

    @abstractmethod
    def _load_into(self, entry: TierRecord, out: torch.Tensor) -> bool:
        """Read ``entry`` into ``out`` (validated dtype/shape). False when the object is
        gone or corrupt (the tier then forgets it); raise ``TierUnavailable`` when the read
        failed for a passing reason (the object stays indexed)."""

    @abstractmethod
    def _release(self, entry: TierRecord) -> None:
        """Free ``entry``'s storage (it is already out of the index; the index lock is held).
        Storage named by key must check ``self._key_busy(key)``: a newer object may own it."""

    def _store_with_meta(self, key: ObjectKey, payload: torch.Tensor, token: object,
                         meta: ObjectMeta | None) -> object | None:
        """``_store`` for a put carrying ``meta``. A tier that persists metadata with the
        bytes overrides this (and its ``_store`` calls it with None); by default the
        metadata lives in the ``TierRecord`` only."""
        return self._store(key, payload, token)

    def _reserve(self, key: ObjectKey, nbytes: int) -> object | None:
        """Reserve room for ``nbytes`` more of ``key.kind``; return a token for ``_store``
        (None: no room). Called under the index lock; the budget check is done already."""
        return True

    def _unreserve(self, key: ObjectKey, nbytes: int, token: object) -> None:
        """Give back a reservation whose ``_store`` failed (under the index lock)."""

    def _put_done(self, key: ObjectKey) -> None:
        self._inflight[key] -= 1
        if self._inflight[key] <= 0:
            del self._inflight[key]

    def _key_busy(self, key: ObjectKey) -> bool:
        """A live object or a put in progress owns ``key`` (under the index lock): storage
        named by key only must then not be freed for an older object."""
        return self._entry(key) is not None or self._inflight.get(key, 0) > 0

    # ---------------------------------------------------------------- interface
    def capacity(self, kind: ObjectKind) -> int:
        return self._budget[kind]

    def used(self, kind: ObjectKind) -> int:
        with self._lock:
            return self._used[kind]

    def _entry(self, key: ObjectKey) -> TierRecord | None:
        e = self._lru[key.kind].get(key)
        return None if e is None or e.doomed else e

    def contains(self, keys: Sequence[ObjectKey], pin: bool = False) -> list[bool]:
        with self._lock:
            out = []
            for k in keys:
                e = self._entry(k)
                if e is not None and pin:
                    e.pins += 1
                out.append(e is not None)
            return out

    def meta(self, key: ObjectKey) -> tuple[tuple[int, ...], torch.dtype, int] | None:
        with self._lock:
            e = self._entry(key)
            return None if e is None else (e.shape, e.dtype, e.nbytes)

    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]],
            metas: Sequence[ObjectMeta | None] | None = None) -> list[bool]:
        ms = check_metas(items, metas)
        out = [self._put_one(k, t, m) for (k, t), m in zip(items, ms, strict=True)]
        if any(out):
            self._after_batch()
        return out

    def _after_batch(self) -> None:
        """Runs once after a ``put`` batch stored anything, before ``put`` returns (e.g. one
        directory fsync for the whole batch)."""

    def _put_one(self, key: ObjectKey, payload: torch.Tensor, meta: ObjectMeta | None = None
                 ) -> bool:
        p = self._admit(key, payload, meta)
        if p is None:
            return False
        handle = None
        try:
            handle = self._store_with_meta(key, payload, p.token, meta)
        finally:
            self._commit(p, handle)
        return handle is not None

    def _admit(self, key: ObjectKey, payload: torch.Tensor, meta: ObjectMeta | None
               ) -> Admitted | None:
        """Validate one put and reserve its room (None: refused, counted as a failure).
        Every admitted put must reach ``_commit`` exactly once, stored or not."""
        why = meta.check_key(key) if meta is not None else None
        if why is not None:
            log.warning("tier %s: metadata does not fit %s: %s", self.name, key.to_str(), why)
        if why is not None or check_payload(payload) is not None:
            self._stats.put_failures += 1
            return None
        n = nbytes_of(payload)
        with self._lock:
            # An old object under the key stays readable until the new one is in, so the
            # new one is reserved on top of it.
            token, until = None, time.monotonic() + ZOMBIE_WAIT_S
            while self._pool_used(key.kind) + n <= self._budget[key.kind]:
                token = self._reserve(key, n)
                if token is not None or not self._zombies or time.monotonic() >= until:
                    break
                # the budget has room, but removed objects a read is still copying out hold
                # it (their storage is freed at the last unpin): wait for that, not fail
                self._freed.wait(until - time.monotonic())
            if token is None:
                self._stats.put_failures += 1
                return None
            self._used[key.kind] += n
            self._inflight[key] += 1
        return Admitted(key, payload, meta, n, token)

    def _commit(self, p: Admitted, handle: object | None) -> None:
        """Finish an admitted put: index ``handle`` (replacing any old object) or, when it
        is None (the store failed), give its reservation back."""
        key, n = p.key, p.nbytes
        with self._lock:
            self._put_done(key)
            if handle is None:
                self._used[key.kind] -= n
                self._unreserve(key, n, p.token)
                self._stats.put_failures += 1
                return
            entry = TierRecord(key, n, tuple(p.payload.shape), p.payload.dtype, handle, meta=p.meta)
            old = self._lru[key.kind].pop(key, None)
            self._lru[key.kind][key] = entry
            self._stats.puts += 1
            self._stats.bytes_written += n
            if old is not None:
                self._drop_entry(old)

    def _drop_entry(self, e: TierRecord) -> None:
        """Account ``e`` as gone (index already updated); free now unless pinned."""
        if e.doomed:
            return
        e.doomed = True
        self._used[e.key.kind] -= e.nbytes
        if e.pins == 0:
            self._release_quiet(e)
        else:
            # Keep a handle so the last unpin can release it.
            self._zombies.setdefault(e.key, []).append(e)

    def _release_quiet(self, e: TierRecord) -> None:
        try:
            self._release(e)
        except OSError:
            self._stats.errors += 1
        self._freed.notify_all()  # a put may be waiting for this room (``_admit``)

    def get_into(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        return [self._get_one(k, o) for k, o in zip(keys, outs, strict=True)]

    def get(
        self, keys: Sequence[ObjectKey], device: torch.device | str | None = None
    ) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        for k in keys:
            m = self.meta(k)
            if m is None:
                self._stats.misses += 1
                out.append(None)
                continue
            buf = torch.empty(m[0], dtype=m[1], device=device or "cpu")
            out.append(buf if self._get_one(k, buf) else None)
        return out

    def _get_one(self, key: ObjectKey, out: torch.Tensor) -> bool:
        e = self._begin_get(key, out)
        if e is None:
            return False
        ok = transient = False
        try:
            ok = self._load_into(e, out)
        except TierUnavailable:
            transient = True  # e.g. the remote is down: the object may still be fine
        finally:
            self._end_get(e, ok, transient)
        return ok

    def _begin_get(self, key: ObjectKey, out: torch.Tensor) -> TierRecord | None:
        """Pin ``key``'s entry for a read into ``out`` and mark it used (None: a miss or a
        mismatched buffer, already counted). A pinned entry must reach ``_end_get``."""
        with self._lock:
            e = self._entry(key)
            if e is None:
                self._stats.misses += 1
                return None
            if tuple(out.shape) != e.shape or out.dtype != e.dtype or not out.is_contiguous():
                self._stats.errors += 1
                return None
            e.pins += 1
            self._lru[key.kind].move_to_end(key)
        return e

    def _end_get(self, e: TierRecord, ok: bool, transient: bool) -> None:
        """Unpin after a read; a failed read that was not ``transient`` forgets the object."""
        with self._lock:
            self._unpin_entry(e)
            if ok:
                self._stats.hits += 1
                self._stats.bytes_read += e.nbytes
            else:
                self._stats.errors += 1
                if not transient:
                    self._forget_corrupt(e)

    def _forget_corrupt(self, e: TierRecord) -> None:
        """A read failed: forget the object so it is never served again (under lock)."""
        cur = self._lru[e.key.kind].get(e.key)
        if cur is e:
            del self._lru[e.key.kind][e.key]
            self._drop_entry(e)

    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        return self.contains(keys, pin=True)

    def unpin(self, keys: Sequence[ObjectKey]) -> None:
        with self._lock:
            for k in keys:
                e = self._lru[k.kind].get(k)
                if e is not None and not e.doomed and e.pins > 0:
                    self._unpin_entry(e)
                    continue
                # A pin on an entry removed meanwhile: release one of its zombies.
                zs = self._zombies.get(k)
                if zs:
                    self._unpin_entry(zs[0])

    def _unpin_entry(self, e: TierRecord) -> None:
        e.pins = max(0, e.pins - 1)
        if e.doomed and e.pins == 0:
            zs = self._zombies.get(e.key, [])
            if e in zs:
                zs.remove(e)
                if not zs:
                    self._zombies.pop(e.key, None)
                self._release_quiet(e)

    def remove(self, keys: Sequence[ObjectKey]) -> list[bool]:
        out = []
        with self._lock:
            for k in keys:
                e = self._entry(k)
                if e is None:
                    out.append(False)
                    continue
                del self._lru[k.kind][k]
                self._drop_entry(e)
                out.append(True)
        return out

    def lru(self, kind: ObjectKind) -> Iterator[ObjectKey]:
        with self._lock:
            snap = [k for k, e in self._lru[kind].items() if e.pins == 0 and not e.doomed]
        return iter(snap)

    def held_keys(self) -> list[ObjectKey]:
        with self._lock:
            return [k for d in self._lru.values() for k, e in d.items() if not e.doomed]

    def pin_count(self, key: ObjectKey) -> int:
        with self._lock:
            e = self._entry(key)
            return 0 if e is None else e.pins

    def object_meta(self, key: ObjectKey) -> ObjectMeta | None:
        with self._lock:
            e = self._entry(key)
            return None if e is None else e.meta

    def inventory(self) -> list[tuple[ObjectKey, int, ObjectMeta | None]]:
        with self._lock:
            return [(e.key, e.nbytes, e.meta) for k in ObjectKind
                    for e in self._lru[k].values() if not e.doomed]

    def stats(self) -> TierStats:
        with self._lock:
            s = TierStats(**{f: getattr(self._stats, f) for f in TierStats.__slots__})
            s.objects = {k.value: len(self._lru[k]) for k in ObjectKind}
            s.used = {k.value: self._used[k] for k in ObjectKind}
            s.capacity = {k.value: self._budget[k] for k in ObjectKind}
            shared = "_".join(k.value for k in ObjectKind if k in self.joint)
            # a shared budget once (``kv_state``), not once per kind that draws on it
            s.pools = {(shared if k in self.joint else k.value): self._budget[k]
                       for k in ObjectKind}
            return s
