"""One preallocated slab split into per-kind arenas, each with a first-fit free-list allocator.

Shared by the device and host tiers: no per-object allocation after construction, and one
kind's pressure or fragmentation can never take room from another kind.
"""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Mapping

import torch

from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers.tier import Entry, IndexedTier, copy_into, nbytes_of

ALIGN = 64  # bytes; keeps every dtype view aligned and copies cache-line friendly


def _round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


class ArenaAllocator:
    """First-fit allocator over ``[base, base + size)`` with coalescing frees.

    Not thread safe (the owning tier serialises calls). ``alloc`` returns an offset or
    None when no free extent is large enough; ``free`` takes back exactly what ``alloc``
    gave (double frees raise ValueError: they would corrupt other objects).
    """

    def __init__(self, base: int, size: int) -> None:
        self.base, self.size = base, size
        # Sorted, non-adjacent free extents as parallel lists (offset, length).
        self._offs: list[int] = [base] if size else []
        self._lens: list[int] = [size] if size else []
        self.allocated = 0

    def alloc(self, nbytes: int) -> int | None:
        need = _round_up(max(nbytes, 1))
        for i, ln in enumerate(self._lens):
            if ln >= need:
                off = self._offs[i]
                if ln == need:
                    del self._offs[i], self._lens[i]
                else:
                    self._offs[i] += need
                    self._lens[i] -= need
                self.allocated += need
                return off
        return None

    def free(self, off: int, nbytes: int) -> None:
        ln = _round_up(max(nbytes, 1))
        if off < self.base or off + ln > self.base + self.size:
            raise ValueError(f"free of [{off}, {off + ln}) outside the arena")
        i = bisect.bisect_left(self._offs, off)
        if (i < len(self._offs) and self._offs[i] < off + ln) or (
            i > 0 and self._offs[i - 1] + self._lens[i - 1] > off
        ):
            raise ValueError(f"double free of [{off}, {off + ln})")
        self._offs.insert(i, off)
        self._lens.insert(i, ln)
        self.allocated -= ln
        # Coalesce with the right then the left neighbour.
        if i + 1 < len(self._offs) and off + ln == self._offs[i + 1]:
            self._lens[i] += self._lens.pop(i + 1)
            self._offs.pop(i + 1)
        if i > 0 and self._offs[i - 1] + self._lens[i - 1] == off:
            self._lens[i - 1] += self._lens.pop(i)
            self._offs.pop(i)

    def largest_free(self) -> int:
        return max(self._lens, default=0)


class SlabTier(IndexedTier):
    """A tier whose objects live in one preallocated byte slab on ``device``.

    Each kind gets an arena of its budget rounded up to ``ALIGN`` per object slack (so the
    alignment padding never makes a budget-respecting put fail for lack of bytes; it can
    still fail from fragmentation, and the manager then demotes more).
    """

    def __init__(
        self,
        name: str,
        budgets: Mapping[ObjectKind, int],
        device: torch.device | str,
        pin_memory: bool = False,
        slack: float = 1.0 / 16,
    ) -> None:
        super().__init__(name, budgets)
        self.device = torch.device(device)
        sizes = {k: _round_up(int(self._budget[k] * (1 + slack))) if self._budget[k] else 0
                 for k in ObjectKind}
        total = sum(sizes.values())
        self._slab = torch.empty(total, dtype=torch.uint8, device=self.device,
                                 pin_memory=pin_memory and self.device.type == "cpu")
        self.pinned = bool(self._slab.is_pinned()) if self.device.type == "cpu" else False
        self._host = self.device.type == "cpu"
        self._base = self._slab.data_ptr()
        self._arena: dict[ObjectKind, ArenaAllocator] = {}
        base = 0
        for k in ObjectKind:
            self._arena[k] = ArenaAllocator(base, sizes[k])
            base += sizes[k]

    def _view(self, off: int, nbytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self._slab[off : off + nbytes].view(dtype).view(shape)

    def fits(self, kind: ObjectKind, nbytes: int) -> bool:
        with self._lock:
            return (self._used[kind] + nbytes <= self._budget[kind]
                    and self._arena[kind].largest_free() >= _round_up(max(nbytes, 1)))

    def _reserve(self, key: ObjectKey, nbytes: int) -> object | None:
        return self._arena[key.kind].alloc(nbytes)

    def _unreserve(self, key: ObjectKey, nbytes: int, token: object) -> None:
        assert isinstance(token, int)
        self._arena[key.kind].free(token, nbytes)

    def _store(self, key: ObjectKey, payload: torch.Tensor, token: object) -> object | None:
        assert isinstance(token, int)
        n = nbytes_of(payload)
        if not n:
            return token
        if self._host and payload.device.type == "cpu":
            # Host to host: one memmove, no tensor views on the hot path.
            ctypes.memmove(self._base + token, payload.data_ptr(), n)
        else:
            copy_into(self._view(token, n, tuple(payload.shape), payload.dtype), payload)
        return token

    def _load_into(self, entry: Entry, out: torch.Tensor) -> bool:
        assert isinstance(entry.handle, int)
        if not entry.nbytes:
            return True
        if self._host and out.device.type == "cpu":
            ctypes.memmove(out.data_ptr(), self._base + entry.handle, entry.nbytes)
        else:
            copy_into(out, self._view(entry.handle, entry.nbytes, entry.shape, entry.dtype))
        return True

    def _release(self, entry: Entry) -> None:
        assert isinstance(entry.handle, int)
        self._arena[entry.key.kind].free(entry.handle, entry.nbytes)

    def close(self) -> None:
        with self._lock:
            self._host = False  # no raw pointer use after the slab is gone
            self._slab = torch.empty(0, dtype=torch.uint8)
