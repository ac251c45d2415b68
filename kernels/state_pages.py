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

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._checks import IndexLike, index_tensor, require_inner_contiguous, require_same_device
from ._grid import block, grid
from ._launch import Launcher, i64, ptr

#: Pages are split into chunks of this many bytes so a few large pages still spread
#: over every SM (a 2 MiB SSM page becomes 32 thread blocks).
CHUNK_BYTES = 64 * 1024


@dataclass
class StateArgs:
    src: list[torch.Tensor]
    dst: list[torch.Tensor]
    src_slots: torch.Tensor
    dst_slots: torch.Tensor


def _as_list(t: torch.Tensor | Sequence[torch.Tensor], name: str) -> list[torch.Tensor]:
    items = [t] if isinstance(t, torch.Tensor) else list(t)
    if not all(isinstance(x, torch.Tensor) for x in items):
        raise ValueError(f"{name} must be a tensor or a sequence of tensors")
    return items


def _page_bytes(t: torch.Tensor) -> int:
    return t.shape[1:].numel() * t.element_size()


def _ranges(t: torch.Tensor, slots: torch.Tensor) -> list[tuple[int, int, bool]]:
    size = _page_bytes(t)
    step = t.stride(0) * t.element_size()
    base = t.data_ptr()
    return [(base + s * step, base + s * step + size, False) for s in slots.tolist()]


def _check_overlap(a: StateArgs) -> None:
    reads: list[tuple[int, int, bool]] = []
    writes: list[tuple[int, int, bool]] = []
    for s, d in zip(a.src, a.dst, strict=True):
        reads += _ranges(s, a.src_slots)
        writes += _ranges(d, a.dst_slots)
    writes.sort()
    for (_, end, _), (start, _, _) in zip(writes, writes[1:], strict=False):
        if start < end:
            raise ValueError("destination pages overlap each other in memory")
    starts = [w[0] for w in writes]
    for lo, hi, _ in reads:
        k = bisect.bisect_left(starts, hi)  # writes starting before this read ends
        if k and writes[k - 1][1] > lo:
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
    device = s_list[0].device
    s_ids = index_tensor(src_slots, "src_slots", upper=min(t.shape[0] for t in s_list), device=torch.device("cpu"), unique=False)
    d_ids = index_tensor(dst_slots, "dst_slots", upper=min(t.shape[0] for t in d_list), device=torch.device("cpu"), unique=True)
    if s_ids.numel() != d_ids.numel():
        raise ValueError(f"{s_ids.numel()} source slots for {d_ids.numel()} destination slots")
    args = StateArgs(s_list, d_list, s_ids, d_ids)
    _check_overlap(args)
    args.src_slots, args.dst_slots = s_ids.to(device), d_ids.to(device)
    return args


def copy_torch(a: StateArgs) -> None:
    for s, d in zip(a.src, a.dst, strict=True):
        d.index_copy_(0, a.dst_slots, s.index_select(0, a.src_slots))


def descriptors(a: StateArgs) -> torch.Tensor:
    """``[N, 3]`` int64 host tensor of (src address, dst address, bytes) chunks."""
    s_slots, d_slots = a.src_slots.cpu(), a.dst_slots.cpu()
    parts = []
    for s, d in zip(a.src, a.dst, strict=True):
        page = _page_bytes(s)
        if page == 0 or s_slots.numel() == 0:
            continue
        es = s.element_size()
        src_addr = s.data_ptr() + s_slots * (s.stride(0) * es)
        dst_addr = d.data_ptr() + d_slots * (d.stride(0) * es)
        offs = torch.arange(0, page, CHUNK_BYTES, dtype=torch.int64)
        sizes = (page - offs).clamp_(max=CHUNK_BYTES)
        desc = torch.stack(
            torch.broadcast_tensors(
                src_addr[:, None] + offs[None, :], dst_addr[:, None] + offs[None, :], sizes[None, :]
            ),
            dim=-1,
        )
        parts.append(desc.reshape(-1, 3))
    if not parts:
        return torch.empty((0, 3), dtype=torch.int64)
    return torch.cat(parts)


def copy_cuda(launcher: Launcher, a: StateArgs) -> None:
    desc = descriptors(a)
    n = desc.shape[0]
    if n == 0:
        return
    width = 16 if bool((desc % 16 == 0).all()) else 1
    dev_desc = desc.to(a.src[0].device)
    launcher.launch(
        "state_pages",
        f"hc_copy_ranges_v{width}",
        grid(n),
        block(min(CHUNK_BYTES, int(desc[:, 2].max())) // width),
        [ptr(dev_desc), i64(n)],
        a.src[0].device,
    )
