"""Data-movement kernels: anchor pack/unpack, paged KV gather/scatter, state page copy.

This module is the one dispatch point (``_launcher_for``): a call whose tensors are
on CUDA runs the CUDA C kernels of ``hybrid_connector/kernels/*.cu`` (through CuPy, or nvcc + libcuda
when CuPy is missing; see ``hybrid_connector.kernels._launch``), anything else runs the vectorised
torch implementation. Both give bit-identical results; the fp8 path too, because
both round the same float32 values with the same rule (tested on CPU against the
kernels' own conversion code). Every function validates its inputs first and raises
``ValueError`` naming the bad argument before writing anything.

Index arguments (positions, block ids, slots) may be sequences of ints, integer
tensors (host-side ones avoid a device synchronisation for the checks) or a
``CheckedIndex``, validated and uploaded once for moves that repeat. CUDA work
is enqueued on torch's current stream of the tensors' device, so it is ordered with
the caller's other work on that stream (run it under ``torch.cuda.stream(s)`` to use
a copy stream).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from . import anchors, paged_kv, state_pages
from ._checks import IndexLike
from ._launch import Launcher, cuda_launcher
from .anchors import PackedAnchors
from .checked_index import CheckedIndex
from .paged_kv import buffer_shape as kv_buffer_shape
from .paged_kv import layout_for_backend

__all__ = [
    "CheckedIndex",
    "PackedAnchors",
    "backend_name",
    "copy_state_pages",
    "gather_kv_blocks",
    "kv_buffer_shape",
    "layout_for_backend",
    "pack_anchors",
    "scatter_kv_blocks",
    "torch_only",
    "unpack_anchors",
    "use_launcher",
]

_local = threading.local()


@contextmanager
def torch_only() -> Iterator[None]:
    """Within this block (this thread only), CUDA tensors also take the torch path."""
    prev = getattr(_local, "torch_only", False)
    _local.torch_only = True
    try:
        yield
    finally:
        _local.torch_only = prev


@contextmanager
def use_launcher(launcher: Launcher) -> Iterator[None]:
    """Within this block (this thread only), run the kernels through ``launcher`` for
    tensors on any device. For tests and debugging: e.g. a launcher that executes the
    ``.cu`` sources on the host, which makes the CUDA path checkable without a GPU."""
    prev = getattr(_local, "launcher", None)
    _local.launcher = launcher
    try:
        yield
    finally:
        _local.launcher = prev


def _launcher_for(t: torch.Tensor) -> Launcher | None:
    """The single dispatch decision: a kernel launcher, or ``None`` for torch."""
    if getattr(_local, "torch_only", False):
        return None
    forced: Launcher | None = getattr(_local, "launcher", None)
    if forced is not None:
        return forced
    if t.device.type != "cuda":
        return None
    return cuda_launcher()


def backend_name(t: torch.Tensor) -> str:
    """``"cupy"``, ``"cubin"`` or ``"torch"``: what a call on ``t`` would run."""
    launcher = _launcher_for(t)
    return "torch" if launcher is None else launcher.name


def pack_anchors(
    hidden: torch.Tensor,
    positions: IndexLike,
    *,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    scale_out: torch.Tensor | None = None,
) -> PackedAnchors:
    """Gather ``hidden[positions]`` into a compact buffer (see ``hybrid_connector.kernels.anchors``).

    ``dtype`` (default ``hidden.dtype``) may be float32, float16, bfloat16 or
    ``torch.float8_e4m3fn`` (then a float32 per-row scale is returned). ``out`` and
    ``scale_out`` are optional preallocated outputs. ``hidden`` is not modified.
    """
    a = anchors.prepare_pack(hidden, positions, dtype, out, scale_out)
    launcher = _launcher_for(hidden)
    if launcher is None:
        anchors.pack_torch(a)
    else:
        anchors.pack_cuda(launcher, a)
    return a.out


def unpack_anchors(
    packed: PackedAnchors | torch.Tensor,
    dst: torch.Tensor,
    positions: IndexLike,
    *,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write the packed rows into ``dst[positions]`` (unique positions); return ``dst``.

    Rows are converted to ``dst.dtype`` (fp8 rows multiplied by their scale first).
    Only the addressed rows of ``dst`` change.
    """
    a = anchors.prepare_unpack(packed, dst, positions, scale)
    launcher = _launcher_for(dst)
    if launcher is None:
        anchors.unpack_torch(a)
    else:
        anchors.unpack_cuda(launcher, a)
    return dst


def gather_kv_blocks(
    cache: torch.Tensor,
    block_ids: IndexLike,
    *,
    layout: str = "flash_attn",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Copy the given blocks of one layer's paged KV cache into a dense buffer.

    Returns ``out`` (allocated if ``None``) of shape
    ``[2, len(block_ids), block_size, num_kv_heads, head_size]``; see
    ``hybrid_connector.kernels.paged_kv`` for layouts. ``cache`` is not modified.
    """
    a = paged_kv.prepare(cache, block_ids, out, layout, scatter=False)
    launcher = _launcher_for(cache)
    if launcher is None:
        paged_kv.gather_torch(a)
    else:
        paged_kv.run_cuda(launcher, a, scatter=False)
    return a.buf


def scatter_kv_blocks(
    cache: torch.Tensor,
    block_ids: IndexLike,
    buf: torch.Tensor,
    *,
    layout: str = "flash_attn",
) -> None:
    """Write a dense ``[2, n, block_size, heads, head_size]`` buffer into the given
    (unique) blocks of one layer's paged KV cache; other blocks are untouched."""
    a = paged_kv.prepare(cache, block_ids, buf, layout, scatter=True)
    launcher = _launcher_for(cache)
    if launcher is None:
        paged_kv.scatter_torch(a)
    else:
        paged_kv.run_cuda(launcher, a, scatter=True)


def copy_state_pages(
    src: torch.Tensor | Sequence[torch.Tensor],
    dst: torch.Tensor | Sequence[torch.Tensor],
    src_slots: IndexLike,
    dst_slots: IndexLike,
) -> None:
    """Copy page ``src[i][src_slots[j]]`` to ``dst[i][dst_slots[j]]`` for all i, j
    (see ``hybrid_connector.kernels.state_pages`` for the no-overlap contract)."""
    a = state_pages.prepare(src, dst, src_slots, dst_slots)
    launcher = _launcher_for(a.src[0])
    if launcher is None:
        state_pages.copy_torch(a)
    else:
        state_pages.copy_cuda(launcher, a)
