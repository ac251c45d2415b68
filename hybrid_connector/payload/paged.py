"""A KV chunk payload as a view of paged KV caches (vLLM-style blocks, through ``hybrid_connector.kernels.paged_kv``).

A paged engine keeps, per attention layer, one cache tensor of fixed-size token blocks, in
one of vLLM's two logical layouts (see ``hybrid_connector.kernels.paged_kv``)::

    "kv_first"     (alias "flash_attn"):  [2, num_blocks, block_size, kv_heads, head_size]
    "blocks_first" (alias "flashinfer"):  [num_blocks, 2, block_size, kv_heads, head_size]

with any strides as long as ``head_size`` is dense (so NHD and HND memory orders, and the
strided views of vLLM's shared page allocation, all work). A request's tokens live in the
blocks of its block table: token t of a chunk is slot ``t % block_size`` of block
``block_ids[t // block_size]``. The block table is one for every layer, or one per layer
(engines whose layers sit in several KV cache groups, each with its own blocks).
:func:`gather_paged_kv` copies a chunk of ``n`` tokens out of those blocks into a payload of
``layout.kv_layout(geometry, n)`` and :func:`scatter_paged_kv` writes a payload, or a
window of its tokens, into (other) blocks, so a chunk saved from one layout or block table
loads into another bit for bit. The integration passes the per-layer caches in
``geometry.attention_layers`` order, already sliced to its own rank.

When ``n`` is a multiple of ``block_size`` a layer's K and V parts, which are adjacent in the
payload, form exactly the ``[2, n_blocks, block_size, heads, head_size]`` buffer of
``kernels.gather_kv_blocks``, so the kernel writes (or reads) the payload directly. A partial
last block (or a window of the payload) goes through a block-sized staging buffer;
scattering a partial last block leaves its slots past the chunk as they were. An fp8 cache
stored as ``uint8`` is accepted for a float8 layout (same bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybrid_connector import kernels
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.payload.parts import Part, PayloadLayout

IndexLike = Sequence[int] | torch.Tensor
"""One layer's block ids."""
BlockTable = IndexLike | Sequence[IndexLike]
"""Block ids shared by every layer, or one :data:`IndexLike` per layer."""

__all__ = ["BlockTable", "IndexLike", "gather_paged_kv", "scatter_paged_kv"]


def _layers(layout: PayloadLayout, caches: Sequence[torch.Tensor], block_ids: BlockTable
            ) -> list[tuple[Part, Part, torch.Tensor, IndexLike]]:
    """(K part, V part, cache, block ids) per attention layer."""
    if layout.kind != ObjectKind.KV:
        raise ValueError(f"paged KV needs a KV layout, got a {layout.kind.value} layout")
    parts = layout.parts
    if len(caches) * 2 != len(parts):
        raise ValueError(f"paged KV: {len(caches)} layer caches for a layout of "
                         f"{len(parts) // 2} attention layers")
    ids: list[IndexLike]
    if isinstance(block_ids, torch.Tensor) or not any(
            isinstance(b, Sequence | torch.Tensor) for b in block_ids):
        ids = [block_ids] * len(caches)  # type: ignore[list-item]
    else:
        ids = list(block_ids)  # type: ignore[arg-type]
        if len(ids) != len(caches):
            raise ValueError(f"paged KV: {len(ids)} block tables for {len(caches)} layer caches")
    return [(parts[2 * j], parts[2 * j + 1], c, ids[j]) for j, c in enumerate(caches)]


def _check(k: Part, cache: torch.Tensor, block_layout: str, n_blocks: int,
           n: int) -> tuple[torch.Tensor, int]:
    """The cache in the part's dtype and its block size; ValueError naming the layer when the
    cache's heads, head size or dtype differ from the layout, or ``n_blocks`` is not the
    ``ceil(n / block_size)`` blocks ``n`` tokens fill."""
    layer = k.name.removesuffix(".k")
    if not isinstance(cache, torch.Tensor) or cache.dim() != 5:
        raise ValueError(f"paged KV: {layer}: cache must be a 5-D paged KV tensor")
    want = k.torch_dtype
    if cache.dtype != want and cache.dtype == torch.uint8 and want.itemsize == 1:
        cache = cache.view(want)
    _, _, block_size, heads, head = kernels.kv_buffer_shape(cache, n_blocks, block_layout)
    if (heads, head) != k.shape[1:] or cache.dtype != want:
        raise ValueError(f"paged KV: {layer}: cache holds {heads} x {head} {cache.dtype} per token, "
                         f"the layout {k.shape[1]} x {k.shape[2]} {want}")
    if n_blocks != -(-n // block_size):
        raise ValueError(f"paged KV: {n} tokens fill {-(-n // block_size)} blocks of "
                         f"{block_size}, got {n_blocks} block ids")
    return cache, block_size


def _chunk_buffer(raw: torch.Tensor, k: Part, v: Part, n_blocks: int, block_size: int) -> torch.Tensor | None:
    """K and V of one layer in the payload bytes ``raw`` as the kernel's chunk buffer, or
    None when they cannot be (partial last block, parts not adjacent or unaligned)."""
    if k.shape[0] != n_blocks * block_size or v.offset != k.end:
        return None
    try:
        return raw[k.offset : v.end].view(k.torch_dtype).view(2, n_blocks, block_size, *k.shape[1:])
    except RuntimeError:
        return None


def gather_paged_kv(layout: PayloadLayout, caches: Sequence[torch.Tensor], block_ids: BlockTable,
                    *, block_layout: str = "flash_attn") -> torch.Tensor:
    """The KV chunk held by ``block_ids`` (shared, or one table per layer) of the per-layer
    paged ``caches``, as a new payload of ``layout`` (a
    :func:`~hybrid_connector.payload.layout.kv_layout`) on the caches' device.

    Block ids may repeat. The caches are only read. Raises ValueError (naming the layer)
    for a cache that does not match the layout, or a block count that does not cover the
    chunk exactly (``ceil(n / block_size)`` blocks)."""
    layers = _layers(layout, caches, block_ids)
    device = caches[0].device if caches else None
    payload, views = layout.allocate(device)
    raw = payload.view(torch.uint8)
    for k, v, cache, ids in layers:
        n = k.shape[0]
        cache, bs = _check(k, cache, block_layout, len(ids), n)
        buf = _chunk_buffer(raw, k, v, len(ids), bs)
        if buf is not None:
            kernels.gather_kv_blocks(cache, ids, layout=block_layout, out=buf)
            continue
        staged = kernels.gather_kv_blocks(cache, ids, layout=block_layout)
        views[k.name].copy_(staged[0].reshape(-1, *k.shape[1:])[:n])
        views[v.name].copy_(staged[1].reshape(-1, *v.shape[1:])[:n])
    return layout.commit(payload, views)


def scatter_paged_kv(layout: PayloadLayout, payload: torch.Tensor, caches: Sequence[torch.Tensor],
                     block_ids: BlockTable, *, block_layout: str = "flash_attn",
                     tokens: tuple[int, int] | None = None) -> None:
    """Write the KV chunk ``payload`` (of ``layout``), or only its tokens ``[lo, hi)`` when
    ``tokens`` is given, into ``block_ids`` (unique; shared, or one table per layer) of the
    per-layer paged ``caches``, the first token at slot 0 of the first block. Only those
    blocks change (of a partial last block, only the written tokens' slots). The payload
    is moved to the caches' device first if needed. Raises ValueError (naming the part or
    layer) before writing anything when the payload, the window, a cache or the block ids
    do not fit."""
    layers = _layers(layout, caches, block_ids)
    full = layout.parts[0].shape[0] if layout.parts else 0
    lo, hi = (0, full) if tokens is None else tokens
    if not 0 <= lo < hi <= full:
        raise ValueError(f"paged KV: tokens [{lo}, {hi}) are not inside the chunk's {full}")
    n = hi - lo
    checked = [(k, v, *_check(k, cache, block_layout, len(ids), n), ids)
               for k, v, cache, ids in layers]
    if checked:
        payload = payload.to(checked[0][2].device)
    raw = layout.as_bytes(payload)
    parts = layout.unpack(payload)
    for k, v, cache, bs, ids in checked:
        buf = _chunk_buffer(raw, k, v, len(ids), bs) if n == full else None
        if buf is None:  # a window or a partial block: staged (keeping the slots past it)
            shape = kernels.kv_buffer_shape(cache, len(ids), block_layout)
            buf = (kernels.gather_kv_blocks(cache, ids, layout=block_layout) if n % bs else
                   torch.empty(shape, dtype=cache.dtype, device=cache.device))
            buf[0].reshape(-1, *k.shape[1:])[:n].copy_(parts[k.name][lo:hi])
            buf[1].reshape(-1, *v.shape[1:])[:n].copy_(parts[v.name][lo:hi])
        kernels.scatter_kv_blocks(cache, ids, buf, layout=block_layout)
