"""Gather and scatter vLLM paged KV blocks to and from a contiguous chunk buffer.

vLLM (checked against ``vllm/v1/attention/backends/flash_attn.py`` and
``flashinfer.py``) hands each attention layer's cache to a connector as one tensor in
its logical shape; its physical order may differ (``get_kv_cache_stride_order``: the
HND layout swaps ``block_size`` and ``num_kv_heads`` in memory). Two logical layouts:

* ``"kv_first"`` (alias ``"flash_attn"``):
  ``[2, num_blocks, block_size, num_kv_heads, head_size]``
* ``"blocks_first"`` (alias ``"flashinfer"``):
  ``[num_blocks, 2, block_size, num_kv_heads, head_size]``

Backends move between the two across vLLM releases, so an integration should not
hard-code the alias: ``layout_for_backend(backend.get_kv_cache_shape)`` finds it the
way vLLM itself does (a sentinel ``num_blocks``).

Any strides are accepted as long as ``head_size`` is dense, so NHD and HND views work
unchanged. The chunk buffer is always dense
``[2, n_blocks, block_size, num_kv_heads, head_size]`` (K plane then V plane, tokens in
block-id order), so a chunk saved from one layout loads into the other. Values are
moved as raw bytes: any dtype (bf16, fp16, fp8 or uint8 fp8 caches) is bit-exact.

``gather``: ``buf[k, i] = cache[k-plane, block_ids[i]]``; repeated ids are allowed.
``scatter``: ``cache[k-plane, block_ids[i]] = buf[k, i]``; ids must be unique. Only
``buf`` (gather) or the selected cache blocks (scatter) are written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._checks import IndexLike, index_tensor, require_inner_contiguous, require_same_device
from ._grid import block, grid, vector_width
from ._launch import Launcher, i64, ptr
from ._words import as_rows, as_words

#: layout name -> dim of the K/V axis (the block axis is the other of dims 0 and 1).
KV_DIM = {"kv_first": 0, "blocks_first": 1, "flash_attn": 0, "flashinfer": 1}

_SENTINEL_BLOCKS = 1234567


def layout_for_backend(get_kv_cache_shape: Callable[..., tuple[int, ...]]) -> str:
    """``"kv_first"`` or ``"blocks_first"`` for a vLLM backend's ``get_kv_cache_shape``.

    Raises ``ValueError`` for shapes this module cannot move (e.g. MLA's 3-D cache).
    """
    shape = tuple(get_kv_cache_shape(_SENTINEL_BLOCKS, 16, 1, 64))
    if len(shape) == 5 and shape[:2] == (2, _SENTINEL_BLOCKS):
        return "kv_first"
    if len(shape) == 5 and shape[:2] == (_SENTINEL_BLOCKS, 2):
        return "blocks_first"
    raise ValueError(f"unsupported paged KV shape {shape} (need a K/V axis of 2 next to the block axis)")


@dataclass
class KVArgs:
    cache: torch.Tensor
    block_ids: torch.Tensor
    buf: torch.Tensor
    kv_dim: int


def buffer_shape(cache: torch.Tensor, n_blocks: int, layout: str) -> tuple[int, ...]:
    """Shape of the chunk buffer holding ``n_blocks`` blocks of ``cache``."""
    kv_dim = _kv_dim(layout)
    _, block_size, heads, head_size = cache.select(kv_dim, 0).shape
    return (2, n_blocks, block_size, heads, head_size)


def _kv_dim(layout: str) -> int:
    try:
        return KV_DIM[layout]
    except KeyError:
        raise ValueError(f"unknown KV layout {layout!r}; expected one of {sorted(KV_DIM)}") from None


def prepare(
    cache: torch.Tensor,
    block_ids: IndexLike,
    buf: torch.Tensor | None,
    layout: str,
    *,
    scatter: bool,
) -> KVArgs:
    """Validate a gather/scatter call (allocating ``buf`` for a gather without one)."""
    kv_dim = _kv_dim(layout)
    if not isinstance(cache, torch.Tensor) or cache.dim() != 5:
        raise ValueError("cache must be a 5-D paged KV tensor")
    if cache.shape[kv_dim] != 2:
        raise ValueError(
            f"layout {layout!r} expects size 2 at dim {kv_dim}, cache has shape {tuple(cache.shape)}"
        )
    require_inner_contiguous(cache, "cache", 1)
    num_blocks = cache.shape[1 - kv_dim]
    ids = index_tensor(block_ids, "block_ids", upper=num_blocks, device=cache.device, unique=scatter)
    shape = buffer_shape(cache, ids.numel(), layout)
    if buf is None:
        if scatter:
            raise ValueError("scatter needs a source buffer")
        buf = torch.empty(shape, dtype=cache.dtype, device=cache.device)
    elif tuple(buf.shape) != shape or buf.dtype != cache.dtype or not buf.is_contiguous():
        raise ValueError(
            f"buffer must be a contiguous {cache.dtype} tensor of shape {shape}, got "
            f"{buf.dtype} {tuple(buf.shape)} contiguous={buf.is_contiguous()}"
        )
    require_same_device(("cache", cache), ("buffer", buf))
    return KVArgs(cache, ids, buf, kv_dim)


def _planes(a: KVArgs, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cache plane k, buffer plane k), as wide words and 2-D rows where possible."""
    plane, buf = a.cache.select(a.kv_dim, k), a.buf[k]
    plane_rows, buf_rows = as_rows(plane), as_rows(buf)
    if plane_rows.dim() == buf_rows.dim() == 2:  # NHD: both merge into [blocks, row]
        plane, buf = plane_rows, buf_rows
    plane_w, buf_w = as_words(plane), as_words(buf)
    if plane_w.dtype != buf_w.dtype:
        return plane, buf
    return plane_w, buf_w


def gather_torch(a: KVArgs) -> None:
    for k in range(2):
        plane, buf = _planes(a, k)
        torch.index_select(plane, 0, a.block_ids, out=buf)


def scatter_torch(a: KVArgs) -> None:
    for k in range(2):
        plane, buf = _planes(a, k)
        plane.index_put_((a.block_ids,), buf)


def run_cuda(launcher: Launcher, a: KVArgs, *, scatter: bool) -> None:
    n = a.block_ids.numel()
    _, _, block_size, heads, head_size = a.buf.shape
    if n == 0 or a.buf.numel() == 0:
        return
    es = a.cache.element_size()
    st = [s * es for s in a.cache.stride()]
    s_kv, s_blk = (st[0], st[1]) if a.kv_dim == 0 else (st[1], st[0])
    head_bytes = head_size * es
    width = vector_width(a.cache.data_ptr(), a.buf.data_ptr(), s_kv, s_blk, st[2], st[3], head_bytes)
    launcher.launch(
        "paged_kv",
        f"hc_kv_blocks_v{width}",
        grid(2 * n * block_size),
        block(heads * head_bytes // width),
        [ptr(a.cache), i64(s_kv), i64(s_blk), i64(st[2]), i64(st[3]), ptr(a.buf),
         ptr(a.block_ids), i64(n), i64(block_size), i64(heads), i64(head_bytes),
         i64(1 if scatter else 0)],
        a.cache.device,
    )
