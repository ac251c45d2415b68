"""Parallel batched I/O for file tiers: a small fork-safe thread pool, the group commit of
a ``put`` batch and the pooled read of a ``get_into`` batch.

Group commit (``put_batch``): every put of the batch is admitted (validated, room
reserved) in order on the caller's thread; the admitted ones are stored on the pool, each
worker encoding (checksum, zstd) and writing its own temporary file, fsyncing it and only
then renaming it over the final name (a rename never exposes bytes that are not on the
media yet); the entries are indexed in batch order; the caller then runs the tier's
``_after_batch`` once (for ``NvmeTier``: ONE directory fsync, which makes every rename of
the batch durable) before ``put`` returns. So a put acknowledged with ``fsync`` on is
durable, a crash at any point leaves each object old, new or absent (never torn), and the
fsync waits of a batch overlap instead of queueing one behind the other.

Results are exactly those of storing the items one by one, in order: a group is stored
before admitting an item whose key it already holds (two writes of one name must not
race) or that would not fit now (a store of the group may still free room: an overwrite
drops the old object, a failure gives its reservation back).

Checksums (xxh3, which holds the GIL) run in the worker threads between the GIL-free
writes, reads and fsyncs of the others, so hashing overlaps I/O.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers.indexed import Admitted, IndexedTier
from hybrid_connector.tiers.tier import TierUnavailable, nbytes_of

T = TypeVar("T")
R = TypeVar("R")


class IoPool:
    """A lazily started ``ThreadPoolExecutor`` of ``threads`` workers. ``map`` runs a
    single item (or everything, with ``threads <= 1``) on the caller's thread, and never
    raises from a worker: each result is ``(value, None)`` or ``(None, exception)``.

    Fork-safe: a child process that inherits the pool (its threads do not survive the
    fork) starts a fresh one at first use."""

    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError(f"io threads must be >= 1, got {threads}")
        self.threads = threads
        self._name = name
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self._name)
                self._pid = os.getpid()
            return self._pool

    def map(self, fn: Callable[[T], R], items: Sequence[T]
            ) -> list[tuple[R | None, BaseException | None]]:
        def safe(x: T) -> tuple[R | None, BaseException | None]:
            try:
                return fn(x), None
            except Exception as exc:  # handed back: the caller settles every item first
                return None, exc

        if self.threads <= 1 or len(items) <= 1:
            return [safe(x) for x in items]
        # One task per worker (items dealt round-robin), not one per item: a task hop
        # costs tens of microseconds, a sizeable share of a small object's read.
        n = min(self.threads, len(items))
        parts = self._executor().map(lambda j: [safe(x) for x in items[j::n]], range(n))
        out: list[tuple[R | None, BaseException | None]] = [(None, None)] * len(items)
        for j, part in enumerate(parts):
            out[j::n] = part
        return out

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.shutdown(wait=True)


def put_batch(tier: IndexedTier, pool: IoPool,
              items: Sequence[tuple[ObjectKey, torch.Tensor]],
              metas: Sequence[ObjectMeta | None]) -> list[bool]:
    """Admit, store on ``pool`` and index ``items`` (see the module docstring); element i
    False when item i was not stored. ``tier._after_batch`` is the caller's to run. An
    unexpected exception from a store is re-raised after every item is settled."""
    out = [False] * len(items)
    group: list[tuple[int, Admitted]] = []
    in_group: set[ObjectKey] = set()
    errors: list[BaseException] = []

    def flush() -> None:
        done = pool.map(lambda p: tier._store_with_meta(p.key, p.payload, p.token, p.meta),
                        [p for _, p in group])
        for (i, p), (handle, exc) in zip(group, done, strict=True):
            tier._commit(p, handle)
            out[i] = handle is not None
            if exc is not None:
                errors.append(exc)
        group.clear()
        in_group.clear()

    for i, ((key, payload), meta) in enumerate(zip(items, metas, strict=True)):
        if group:
            n = nbytes_of(payload) if isinstance(payload, torch.Tensor) else 0
            if key in in_group or not tier.fits(key.kind, n):
                flush()
        p = tier._admit(key, payload, meta)
        if p is not None:
            group.append((i, p))
            in_group.add(key)
    if group:
        flush()
    if errors:
        raise errors[0]
    return out


def get_batch(tier: IndexedTier, pool: IoPool, keys: Sequence[ObjectKey],
              outs: Sequence[torch.Tensor]) -> list[bool]:
    """``get_into`` with the reads on ``pool``: entries are pinned and marked used in key
    order, read in parallel into ``outs``, then unpinned (a failed read forgets its object,
    as ``IndexedTier._get_one`` does). An unexpected exception from a read is re-raised
    after every entry is unpinned."""
    entries = [tier._begin_get(k, o) for k, o in zip(keys, outs, strict=True)]
    todo = [i for i, e in enumerate(entries) if e is not None]

    def load(i: int) -> bool:
        e = entries[i]
        assert e is not None
        return tier._load_into(e, outs[i])

    out = [False] * len(keys)
    errors: list[BaseException] = []
    for i, (ok, exc) in zip(todo, pool.map(load, todo), strict=True):
        e = entries[i]
        assert e is not None
        transient = isinstance(exc, TierUnavailable)  # the object may still be fine
        tier._end_get(e, bool(ok), transient)
        out[i] = bool(ok)
        if exc is not None and not transient:
            errors.append(exc)
    if errors:
        raise errors[0]
    return out


def alloc_and_get(tier: IndexedTier, pool: IoPool, keys: Sequence[ObjectKey],
                  device: torch.device | str | None) -> list[torch.Tensor | None]:
    """``Tier.get`` on top of ``get_batch``: fresh buffers sized from the index."""
    bufs: list[torch.Tensor | None] = []
    for k in keys:
        m = tier.meta(k)
        if m is None:
            with tier._lock:
                tier._stats.misses += 1
        bufs.append(None if m is None else torch.empty(m[0], dtype=m[1], device=device or "cpu"))
    idx = [i for i, b in enumerate(bufs) if b is not None]
    got = get_batch(tier, pool, [keys[i] for i in idx], [b for b in bufs if b is not None])
    for i, ok in zip(idx, got, strict=True):
        if not ok:
            bufs[i] = None
    return bufs

