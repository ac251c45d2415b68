"""Host-pool pages of the SGLang backend, checked before any byte moves (no SGLang import).

SGLang hands the backend host-pool indices and tensors, and nothing else bounds them: a
negative index reads Python-style from the pool's end, an index near the end reads a short
slice, and a tensor of any size stored under a page hash is then counted by ``exists`` and
failed by every load. So:

* ``page_starts``: a transfer's ``host_indices`` are checked whole before any page moves:
  integers, ``0 <= i < pool.size``, ``page_size`` per page and each page's slots
  consecutive (the slots ``get_data_page``/``set_from_flat_data_page`` touch from its
  first). Anything else refuses the whole transfer: nothing is stored or loaded.
* ``PageSpec``: what one page of a pool is (its flat dummy page's element count and
  dtype). Every page stored has it; a held object without it is replaced on the next set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.tiers.store import ObjectStore


@dataclass(frozen=True)
class PageSpec:
    """One flat page of a host pool: ``numel`` elements of ``dtype``."""

    numel: int
    dtype: torch.dtype

    @classmethod
    def of(cls, pool: Any) -> PageSpec:
        page = pool.get_dummy_flat_data_page()
        return cls(page.numel(), page.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def fits(self, t: torch.Tensor) -> bool:
        """``t`` is a page of this spec (any shape of ``numel`` elements of ``dtype``)."""
        return t.dtype == self.dtype and t.numel() == self.numel

    def fits_meta(self, meta: tuple[tuple[int, ...], torch.dtype, int]) -> bool:
        """A held object's ``(shape, dtype, nbytes)`` is a page of this spec."""
        shape, dtype, nbytes = meta
        return dtype == self.dtype and math.prod(shape) == self.numel and nbytes == self.nbytes

    def coerce(self, value: torch.Tensor) -> torch.Tensor | None:
        """``value`` as a flat page of this spec, its bytes unchanged (another dtype is
        reinterpreted, not converted); None when its byte count is not the page's."""
        if value.numel() * value.element_size() != self.nbytes:
            return None
        flat = value.contiguous().reshape(-1)
        return flat if flat.dtype == self.dtype else flat.view(torch.uint8).view(self.dtype)


def page_starts(pool: Any, pages: int, host_indices: torch.Tensor | None) -> list[int] | str:
    """The first slot of each of ``pages`` pages in ``host_indices``, or why they are
    refused (see the module docstring). ``pool.page_size`` (default 1) and ``pool.size``
    (its slots; a pool without one is refused) are SGLang's host pool attributes."""
    step = int(getattr(pool, "page_size", 1) or 1)
    size = getattr(pool, "size", None)
    if not isinstance(size, int) or size <= 0:
        return f"the pool has no slot count (size={size!r}) to check indices against"
    if not isinstance(host_indices, torch.Tensor) or host_indices.numel() != pages * step:
        got = host_indices.numel() if isinstance(host_indices, torch.Tensor) else host_indices
        return f"{got} host indices for {pages} pages of {step}"
    dt = host_indices.dtype
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        return f"host indices of dtype {dt}"
    idx = host_indices.detach().reshape(pages, step).to("cpu", torch.int64)
    if pages == 0:
        return []
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= size:
        return f"host indices {lo}..{hi} outside the pool's {size} slots"
    starts = idx[:, :1]
    if step > 1 and not torch.equal(idx - starts, torch.arange(step).expand(pages, step)):
        return f"a page's {step} host indices are not consecutive slots"
    return [int(s) for s in starts.reshape(-1).tolist()]


def held_fits(store: ObjectStore, key: ObjectKey, spec: PageSpec) -> bool | None:
    """None: ``key`` is not held; else whether the held object is a page of ``spec``. A
    copy held only on the shared tier is judged by the size it was adopted with (its bytes
    are not read here; a wrong one is a miss when loaded)."""
    tier = store.where([key])[0]
    if tier is None:
        return None
    if tier != store.ledger.shared_tier:
        meta = store.tier(tier).meta(key)
        return None if meta is None else spec.fits_meta(meta)
    with store.lock:
        entry = store.ledger.entries.get(key)
    return None if entry is None else entry.nbytes == spec.nbytes
