"""One preallocated slab split into per-kind pools of fixed-size pages (kinds given one
shared budget, ``joint``, share one pool).

Shared by the device and host tiers: no per-object allocation after construction, one
kind's pressure can never take room from another kind, and no external fragmentation: an
object takes ``ceil(nbytes / page)`` pages wherever they are free (consecutive pages form
one run, copied at once), so a put that fits the budget in whole pages always finds room.
That is what lets the ledger's byte accounting (``Tier.granularity``) match the slab
exactly. Pages are sized per pool (``page_bytes``): a power of two, at least ``ALIGN``, of
``budget / PAGES_PER_POOL`` to twice that, so page lists stay short, power-of-two objects
(KV chunks) waste nothing and the waste is under one page per object (states, a prompt's
partial last chunk).
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection, Mapping

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.indexed import IndexedTier
from hybrid_connector.tiers.prefault import Prefault
from hybrid_connector.tiers.tier import TierRecord, copy_into, nbytes_of

ALIGN = 64  # bytes; keeps every dtype view aligned and copies cache-line friendly
PAGES_PER_POOL = 8192  # at most; half as many at least (pages are powers of two)

Runs = tuple[tuple[int, int], ...]  # (byte offset in the slab, bytes) of an object's pieces


def _order(kind: ObjectKind) -> int:
    return list(ObjectKind).index(kind)


def _round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def page_bytes(budget: int) -> int:
    """Page size of a pool of ``budget`` bytes: the smallest power of two (at least ALIGN)
    giving at most ``PAGES_PER_POOL`` pages. A power of two, so that the power-of-two
    objects (KV chunks: 2^k tokens of 2^j bytes each) fill whole pages: a page of
    ``budget / PAGES_PER_POOL`` rounded to ALIGN alone (2,240 B for 8.99 MB) charged a
    16,384 B chunk 17,920 B, a tenth of a KV pool wasted (the vLLM head-to-head's
    Mooncake replay at 2x the working set: 0.282 -> 0.290). Up to 8,192 pages rather than
    4,096 (2,048 B rather than 4,096 B at 8.99 MB): less waste on the objects of other
    sizes (agents one request at a time at 1x: 0.871 with 4,096 B pages, 0.883)."""
    target = max(ALIGN, -(-budget // PAGES_PER_POOL))
    return 1 << (target - 1).bit_length()


class PagePool:
    """``npages`` pages of ``page`` bytes from slab offset ``base``. Not thread safe (the
    owning tier serialises calls). ``alloc`` returns the runs of an object or None when
    too few pages are free; ``free`` takes back exactly what ``alloc`` gave (a double free
    raises ValueError: it would corrupt other objects)."""

    def __init__(self, base: int, npages: int, page: int) -> None:
        self.base, self.npages, self.page = base, npages, page
        self._free = list(range(npages - 1, -1, -1))  # a stack: lowest pages come out first
        self._used = bytearray(npages)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_for(self, nbytes: int) -> int:
        return -(-max(nbytes, 1) // self.page)

    def alloc(self, nbytes: int) -> Runs | None:
        need = self.pages_for(nbytes)
        if need > len(self._free):
            return None
        pages = sorted(self._free.pop() for _ in range(need))
        runs: list[list[int]] = []
        for p in pages:
            self._used[p] = 1
            if runs and runs[-1][0] + runs[-1][1] == p:
                runs[-1][1] += 1
            else:
                runs.append([p, 1])
        left = max(nbytes, 1)
        out = []
        for first, count in runs:
            n = min(left, count * self.page)
            out.append((self.base + first * self.page, n))
            left -= n
        return tuple(out)

    def free(self, runs: Runs) -> None:
        pages: list[int] = []
        for off, n in runs:
            first, rem = divmod(off - self.base, self.page)
            if rem or not 0 <= first < self.npages:
                raise ValueError(f"free of a run at {off} outside the pool")
            pages += range(first, first + -(-n // self.page))
        if any(not self._used[p] for p in pages) or len(set(pages)) != len(pages):
            raise ValueError(f"double free of pages {pages}")
        for p in pages:
            self._used[p] = 0
        self._free.extend(sorted(pages, reverse=True))


class SlabTier(IndexedTier):
    """A tier whose objects live in one preallocated byte slab on ``device``, each kind in
    its own pool of pages (see the module docstring)."""

    def __init__(
        self,
        name: str,
        budgets: Mapping[ObjectKind, int],
        device: torch.device | str,
        pin_memory: bool = False,
        joint: Collection[ObjectKind] = (),
    ) -> None:
        super().__init__(name, budgets, joint)
        self.device = torch.device(device)
        # one page pool per budget: the ``joint`` kinds share the first one's
        own = [k for k in ObjectKind if k not in self.joint or k is min(self.joint, key=_order)]
        pages = {k: page_bytes(self._budget[k]) for k in ObjectKind}
        counts = {k: self._budget[k] // pages[k] for k in ObjectKind}
        total = sum(counts[k] * pages[k] for k in own)
        self._slab = torch.empty(total, dtype=torch.uint8, device=self.device,
                                 pin_memory=pin_memory and self.device.type == "cpu")
        self.pinned = bool(self._slab.is_pinned()) if self.device.type == "cpu" else False
        self._host = self.device.type == "cpu"
        self._base = self._slab.data_ptr()
        self._prefault: Prefault | None = None
        self._pools: dict[ObjectKind, PagePool] = {}
        base = 0
        for k in own:
            self._pools[k] = PagePool(base, counts[k], pages[k])
            base += counts[k] * pages[k]
        for k in self.joint:
            self._pools[k] = self._pools[min(self.joint, key=_order)]

    def prefault(self) -> None:
        """Fault the slab's pages in on a background thread (``hybrid_connector.tiers.prefault``), so first
        puts cost a copy, not a page fault per page. Opt-in (the cache server does it): a
        process that builds tiers it barely fills would touch memory for nothing. Pinned
        memory is touched by pinning already; device memory has no such cost."""
        if self._host and not self.pinned and self._prefault is None:
            self._prefault = Prefault(self._base, self._slab.numel())

    def granularity(self, kind: ObjectKind) -> int:
        """An object of ``kind`` takes whole pages of this size."""
        return self._pools[kind].page

    def _bytes(self, off: int, nbytes: int) -> torch.Tensor:
        return self._slab[off : off + nbytes]

    def fits(self, kind: ObjectKind, nbytes: int) -> bool:
        with self._lock:
            pool = self._pools[kind]
            return (self._pool_used(kind) + nbytes <= self._budget[kind]
                    and pool.free_pages >= pool.pages_for(nbytes))

    def _reserve(self, key: ObjectKey, nbytes: int) -> object | None:
        return self._pools[key.kind].alloc(nbytes)

    def _unreserve(self, key: ObjectKey, nbytes: int, token: object) -> None:
        assert isinstance(token, tuple)
        self._pools[key.kind].free(token)

    def _store(self, key: ObjectKey, payload: torch.Tensor, token: object) -> object | None:
        assert isinstance(token, tuple)
        n = nbytes_of(payload)
        if not n:
            return token
        if self._host and payload.device.type == "cpu":
            src, pos = payload.data_ptr(), 0
            for off, ln in token:  # host to host: one memmove per run
                ctypes.memmove(self._base + off, src + pos, ln)
                pos += ln
            return token
        flat = payload.reshape(-1).view(torch.uint8)
        pos = 0
        for off, ln in token:
            copy_into(self._bytes(off, ln), flat[pos : pos + ln])
            pos += ln
        return token

    def _load_into(self, entry: TierRecord, out: torch.Tensor) -> bool:
        runs = entry.handle
        assert isinstance(runs, tuple)
        if not entry.nbytes:
            return True
        if self._host and out.device.type == "cpu":
            dst, pos = out.data_ptr(), 0
            for off, ln in runs:
                ctypes.memmove(dst + pos, self._base + off, ln)
                pos += ln
            return True
        flat = out.reshape(-1).view(torch.uint8)
        pos = 0
        for off, ln in runs:
            copy_into(flat[pos : pos + ln], self._bytes(off, ln))
            pos += ln
        return True

    def _release(self, entry: TierRecord) -> None:
        assert isinstance(entry.handle, tuple)
        self._pools[entry.key.kind].free(entry.handle)

    def close(self) -> None:
        if self._prefault is not None:
            self._prefault.stop()
        with self._lock:
            self._host = False  # no raw pointer use after the slab is gone
            self._slab = torch.empty(0, dtype=torch.uint8)
