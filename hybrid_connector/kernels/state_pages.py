"""Copy whole recurrent-state pages (Mamba2 / GDN conv and SSM states) between slots.

vLLM keeps each recurrent layer's states as tensors indexed by slot (block id) along
dim 0, often views into one shared buffer with a padded page stride; a page is
``tensor[slot]``, which must be dense. One call moves ``src[i][src_slots[j]]`` to
``dst[i][dst_slots[j]]`` for every tensor pair ``i`` and slot pair ``j``; ``dst`` may
be ``src`` (copy-on-write between slots) or, for example, a ``[n, ...]`` staging
tensor (``dst_slots = range(n)``) to save pages.

Contract: all tensors on one device, each pair with equal dtype and page shape,
``dst_slots`` unique, and no destination page may overlap any source page or another
destination page in memory (checked on byte ranges, so views of one buffer are
covered); those would make the result depend on copy order. Raises ``ValueError``
before writing anything. Only the destination pages are written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ._checks import (
    IndexLike,
    index_tensor,
    require_inner_contiguous,
    require_same_device,
    to_device,
)
from ._grid import block, grid, vector_width
from ._launch import Launcher, i64, ptr
from ._words import as_rows, as_words

#: Pages are split into chunks of this many bytes so a few large pages still spread
#: over every SM (a 2 MiB SSM page becomes 32 thread blocks).
CHUNK_BYTES = 64 * 1024


@dataclass
class StateArgs:
    src: list[torch.Tensor]
    dst: list[torch.Tensor]
    src_slots: torch.Tensor  # on the tensors' device
    dst_slots: torch.Tensor
    table: torch.Tensor  # host int64 [n_tensors, 5], see state_pages.cu


def _as_list(t: torch.Tensor | Sequence[torch.Tensor], name: str) -> list[torch.Tensor]:
    items = [t] if isinstance(t, torch.Tensor) else list(t)
    if not all(isinstance(x, torch.Tensor) for x in items):
        raise ValueError(f"{name} must be a tensor or a sequence of tensors")
    return items


def _page_bytes(t: torch.Tensor) -> int:
    return t.shape[1:].numel() * t.element_size()


def _table(src: list[torch.Tensor], dst: list[torch.Tensor]) -> torch.Tensor:
    rows = [
        (s.data_ptr(), d.data_ptr(), s.stride(0) * s.element_size(), d.stride(0) * d.element_size(), _page_bytes(s))
        for s, d in zip(src, dst, strict=True)
    ]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 5)


def _check_overlap(table: torch.Tensor, s_ids: torch.Tensor, d_ids: torch.Tensor) -> None:
    """Reject destination byte ranges that overlap each other or any source range."""
    if s_ids.numel() == 0:
        return
    # numpy: a few hundred ranges, where torch's per-op overhead dominates
    tab, src, dst = table.numpy(), s_ids.numpy(), d_ids.numpy()
    size = tab[:, 4:5]
    w_lo = (tab[:, 1:2] + dst[None, :] * tab[:, 3:4]).ravel()
    w_hi = w_lo + np.broadcast_to(size, (tab.shape[0], dst.size)).ravel()
    order = np.argsort(w_lo, kind="stable")
    w_lo, w_hi = w_lo[order], w_hi[order]
    keep = w_hi > w_lo
    w_lo, w_hi = w_lo[keep], w_hi[keep]
    if w_lo.size == 0:
        return
    if bool((w_lo[1:] < w_hi[:-1]).any()):
        raise ValueError("destination pages overlap each other in memory")
    r_lo = (tab[:, 0:1] + src[None, :] * tab[:, 2:3]).ravel()
    r_hi = r_lo + np.broadcast_to(size, (tab.shape[0], src.size)).ravel()
    # sorted, disjoint writes: the last write starting before a read ends is the only
    # candidate for overlapping it
    k = np.searchsorted(w_lo, r_hi, side="left")
    cand = np.maximum(k - 1, 0)
    if bool(((k > 0) & (w_hi[cand] > r_lo) & (r_hi > r_lo)).any()):
        raise ValueError("a destination page overlaps a source page in memory")


def prepare(
    src: torch.Tensor | Sequence[torch.Tensor],
    dst: torch.Tensor | Sequence[torch.Tensor],
    src_slots: IndexLike,
    dst_slots: IndexLike,
) -> StateArgs:
    """Validate a page copy; raises ``ValueError`` on bad input."""
    s_list, d_list = _as_list(src, "src"), _as_list(dst, "dst")
    if len(s_list) != len(d_list) or not s_list:
        raise ValueError(f"need matching non-empty tensor lists, got {len(s_list)} and {len(d_list)}")
    for i, (s, d) in enumerate(zip(s_list, d_list, strict=True)):
        if s.dim() < 1 or d.dim() < 1:
            raise ValueError(f"state tensor pair {i} must have a slot dim")
        if s.dtype != d.dtype or s.shape[1:] != d.shape[1:]:
            raise ValueError(
                f"state tensor pair {i}: src {s.dtype} {tuple(s.shape)} and dst {d.dtype} "
                f"{tuple(d.shape)} differ in dtype or page shape"
            )
        if s.dim() > 1:
            require_inner_contiguous(s, f"src[{i}]", s.dim() - 1)
            require_inner_contiguous(d, f"dst[{i}]", d.dim() - 1)
        require_same_device(("src[0]", s_list[0]), (f"src[{i}]", s), (f"dst[{i}]", d))
    cpu = torch.device("cpu")
    s_ids = index_tensor(src_slots, "src_slots", upper=min(t.shape[0] for t in s_list), device=cpu, unique=False)
    d_ids = index_tensor(dst_slots, "dst_slots", upper=min(t.shape[0] for t in d_list), device=cpu, unique=True)
    if s_ids.numel() != d_ids.numel():
        raise ValueError(f"{s_ids.numel()} source slots for {d_ids.numel()} destination slots")
    table = _table(s_list, d_list)
    _check_overlap(table, s_ids, d_ids)
    device = s_list[0].device
    return StateArgs(s_list, d_list, to_device(s_ids, device), to_device(d_ids, device), table)


def copy_torch(a: StateArgs) -> None:
    for s, d in zip(a.src, a.dst, strict=True):
        if s.dim() == 1:  # a page of one element: nothing to reinterpret
            d.index_copy_(0, a.dst_slots, s.index_select(0, a.src_slots))
            continue
        s_rows, d_rows = as_rows(s), as_rows(d)
        if s_rows.dim() != 2 or d_rows.dim() != 2:
            s_rows, d_rows = s, d
        s_w, d_w = as_words(s_rows), as_words(d_rows)
        if s_w.dtype != d_w.dtype:  # differently aligned: move them as they are
            s_w, d_w = s_rows, d_rows
        d_w.index_put_((a.dst_slots,), s_w.index_select(0, a.src_slots))


def copy_cuda(launcher: Launcher, a: StateArgs) -> None:
    n_pairs = a.src_slots.numel()
    max_page = int(a.table[:, 4].max())
    if n_pairs == 0 or max_page == 0:
        return
    chunks = -(-max_page // CHUNK_BYTES)
    width = vector_width(*a.table.flatten().tolist())
    table = to_device(a.table, a.src[0].device)
    n_tensors = a.table.shape[0]
    launcher.launch(
        "state_pages",
        f"hc_copy_pages_v{width}",
        grid(n_tensors * n_pairs * chunks),
        block(min(max_page, CHUNK_BYTES) // width),
        [ptr(table), i64(n_tensors), ptr(a.src_slots), ptr(a.dst_slots), i64(n_pairs), i64(chunks),
         i64(CHUNK_BYTES)],
        a.src[0].device,
    )
