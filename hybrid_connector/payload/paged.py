"""A KV chunk payload as a view of vLLM-style paged KV caches (through ``hybrid_connector.kernels.paged_kv``).

A paged engine keeps, per attention layer, one cache tensor of fixed-size token blocks, in
one of vLLM's two logical layouts (see ``hybrid_connector.kernels.paged_kv``)::

    "kv_first"     (alias "flash_attn"):  [2, num_blocks, block_size, kv_heads, head_size]
    "blocks_first" (alias "flashinfer"):  [num_blocks, 2, block_size, kv_heads, head_size]

with any strides as long as ``head_size`` is dense (so NHD and HND memory orders both
work). A request's tokens live in the blocks of its block table: token t of a chunk is slot
``t % block_size`` of block ``block_ids[t // block_size]``. :func:`gather_paged_kv` copies a
chunk of ``n`` tokens out of those blocks into a payload of ``layout.kv_layout(geometry, n)``
and :func:`scatter_paged_kv` writes a payload into (other) blocks, so a chunk saved from one
layout or block table loads into another bit for bit. The integration passes the per-layer
caches in ``geometry.attention_layers`` order, already sliced to its own rank.

When ``n`` is a multiple of ``block_size`` a layer's K and V parts, which are adjacent in the
payload, form exactly the ``[2, n_blocks, block_size, heads, head_size]`` buffer of
``kernels.gather_kv_blocks``, so the kernel writes (or reads) the payload directly. A partial
last block goes through a block-sized staging buffer; scattering it leaves the slots of the
last block past ``n`` as they were. An fp8 cache stored as ``uint8`` is accepted for a
float8 layout (same bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybrid_connector import kernels
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.payload.layout import Part, PayloadLayout

IndexLike = Sequence[int] | torch.Tensor


def _layer_pairs(layout: PayloadLayout, caches: Sequence[torch.Tensor]) -> list[tuple[Part, Part, torch.Tensor]]:
    if layout.kind != ObjectKind.KV:
        raise ValueError(f"paged KV needs a KV layout, got a {layout.kind.value} layout")
    parts = layout.parts
    if len(caches) * 2 != len(parts):
        raise ValueError(f"paged KV: {len(caches)} layer caches for a layout of "
                         f"{len(parts) // 2} attention layers")
    return [(parts[2 * j], parts[2 * j + 1], c) for j, c in enumerate(caches)]


def _check(k: Part, cache: torch.Tensor, block_layout: str, n_blocks: int) -> tuple[torch.Tensor, int]:
    """The cache in the part's dtype and its block size; ValueError naming the layer when the
    cache's heads, head size or dtype differ from the layout, or too few/many blocks."""
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
    n = k.shape[0]
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


def gather_paged_kv(layout: PayloadLayout, caches: Sequence[torch.Tensor], block_ids: IndexLike,
                    *, block_layout: str = "flash_attn") -> torch.Tensor:
    """The KV chunk held by ``block_ids`` of the per-layer paged ``caches``, as a new payload
    of ``layout`` (a :func:`~hybrid_connector.payload.layout.kv_layout`) on the caches' device.

    ``block_ids`` may repeat. The caches are only read. Raises ValueError (naming the layer)
    for a cache that does not match the layout, or a block count that does not cover the
    chunk exactly (``ceil(n / block_size)`` blocks)."""
    pairs = _layer_pairs(layout, caches)
    n_blocks = len(block_ids)
    device = caches[0].device if caches else None
    payload, views = layout.allocate(device)
    raw = payload.view(torch.uint8)
    for k, v, cache in pairs:
        cache, bs = _check(k, cache, block_layout, n_blocks)
        buf = _chunk_buffer(raw, k, v, n_blocks, bs)
        if buf is not None:
            kernels.gather_kv_blocks(cache, block_ids, layout=block_layout, out=buf)
            continue
        staged = kernels.gather_kv_blocks(cache, block_ids, layout=block_layout)
        n = k.shape[0]
        views[k.name].copy_(staged[0].reshape(-1, *k.shape[1:])[:n])
        views[v.name].copy_(staged[1].reshape(-1, *v.shape[1:])[:n])
    return layout.commit(payload, views)


def scatter_paged_kv(layout: PayloadLayout, payload: torch.Tensor, caches: Sequence[torch.Tensor],
                     block_ids: IndexLike, *, block_layout: str = "flash_attn") -> None:
    """Write the KV chunk ``payload`` (of ``layout``) into ``block_ids`` (unique) of the
    per-layer paged ``caches``; only those blocks change (of a partial last block, only the
    chunk's slots). The payload is moved to the caches' device first if needed. Raises
    ValueError (naming the part or layer) before writing anything when the payload, a cache
    or the block ids do not fit."""
    pairs = _layer_pairs(layout, caches)
    n_blocks = len(block_ids)
    checked = [(k, v, *_check(k, cache, block_layout, n_blocks)) for k, v, cache in pairs]
    if checked:
        payload = payload.to(checked[0][2].device)
    raw = layout.as_bytes(payload)
    parts = layout.unpack(payload)
    for k, v, cache, bs in checked:
        buf = _chunk_buffer(raw, k, v, n_blocks, bs)
        if buf is None:  # partial block: keep the slots past the chunk
            buf = kernels.gather_kv_blocks(cache, block_ids, layout=block_layout)
            n = k.shape[0]
            buf[0].reshape(-1, *k.shape[1:])[:n].copy_(parts[k.name])
            buf[1].reshape(-1, *v.shape[1:])[:n].copy_(parts[v.name])
        kernels.scatter_kv_blocks(cache, block_ids, buf, layout=block_layout)
