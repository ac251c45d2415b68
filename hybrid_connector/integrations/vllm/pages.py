"""vLLM 0.33's paged buffers as the connector moves them.

What ``register_kv_caches`` receives (``vllm/v1/worker/utils.py``: ``allocate_kv_cache``
-> ``kv_cache_interface.create_kv_cache_views``): per layer a 4-D ``[B, H, N, C]`` view of
one int8 allocation that every KV cache group aliases, its strides set by the resolved
``KVCacheLayout`` (``LBNHC``/NHD, ``LBHNC``/HND, the block-outer ``BLNHC``/``BLHNC``; the
block stride counts every group's or layer's page between two blocks, so views are not
contiguous):

* attention (``AttentionSpec``): ``[blocks, kv heads, block_size, C]`` in the spec's dtype,
  ``B`` counting kernel blocks when the backend splits a block (``ratio`` per block).
  What ``C`` holds is the backend's: FlashAttention, FlashInfer, Triton and FlexAttention
  read ``C = [K | V]`` of one token and head (``kv_cache.transpose(1, 2).split(head_size,
  -1)``); CPU attention reads a head's ``[N, 2 * head_size]`` page as ``[2 * N,
  head_size]``, K rows then V rows (``cpu_attn.py``; ``HEAD_PLANES``).
* a Mamba/GDN layer (``MambaSpec``): ``[blocks, 1, 1, state bytes]`` int8, the block stride
  the padded page; the layer slices its state tensors out of it with
  ``MambaBase.bind_kv_cache``, which is what :func:`state_views` calls.

:func:`kv_view` turns an attention view into a strided ``[2, blocks, block_size, heads,
head_size]`` view of the same bytes (K plane, V plane), the ``kv_first`` form
``hybrid_connector.kernels.paged_kv`` moves with any strides; it never copies, so every write lands in
vLLM's bytes and only in the addressed tokens. Shapes it cannot express as such a view
(packed quantized pages, asymmetric K/V heads, a kernel-block split whose token axis does
not merge) raise ``HybridStartupError`` at registration.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from types import SimpleNamespace
from typing import Any

import torch

from hybrid_connector.integrations.vllm.setup import HybridStartupError

#: backends whose page of one head holds all K rows, then all V rows
HEAD_PLANES = frozenset({"CPU_ATTN"})


def attention_backends(vllm_config: Any, names: list[str]) -> dict[str, str | None]:
    """The backend name of each attention layer, from the layers the model registered in
    vLLM's static forward context (None where a layer is not there)."""
    ctx: Mapping[str, Any] = getattr(vllm_config.compilation_config, "static_forward_context", {})
    out: dict[str, str | None] = {}
    for name in names:
        get = getattr(ctx.get(name), "get_attn_backend", None)
        out[name] = get().get_name() if get is not None else None
    return out


def kv_view(name: str, cache: Any, spec: Any, num_blocks: int, backend: str | None) -> torch.Tensor:
    """``[2, num_blocks, block_size, heads, head_size]`` view of one attention layer's
    ``[B, H, N, C]`` page view (see the module docstring)."""
    bs, heads, hs = spec.block_size, spec.num_kv_heads, spec.head_size
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4:
        shape = tuple(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise HybridStartupError(f"{name}: expected vLLM's [B, H, N, C] page view, got {shape}")
    if (getattr(spec, "num_head_slots", None) is not None
            or getattr(spec, "state_content_bytes", None) is not None
            or spec.head_size_v != hs):
        raise HybridStartupError(f"{name}: packed or asymmetric K/V pages ({backend}) are not "
                                 "moved by HybridConnector")
    b, h, n, c = cache.shape
    if h != heads or c != 2 * hs or b * n != num_blocks * bs or b % num_blocks:
        raise HybridStartupError(
            f"{name}: page view of shape {tuple(cache.shape)} is not [B, {heads}, N, {2 * hs}] "
            f"over {num_blocks} blocks of {bs} tokens")
    try:
        if backend in HEAD_PLANES:
            x = cache.view(b, h, 2, n, hs).permute(2, 0, 3, 1, 4)
        else:
            x = cache.unflatten(-1, (2, hs)).permute(3, 0, 2, 1, 4)
    except RuntimeError as e:
        raise HybridStartupError(f"{name}: {backend} page view with strides {cache.stride()} "
                                 f"cannot be split into K and V in place ({e})") from None
    if b != num_blocks:  # kernel blocks: block j of manager block i is i * ratio + j
        x = x.unflatten(1, (num_blocks, b // num_blocks))  # [2, blocks, ratio, n, H, D]
        st = x.stride()
        if st[2] != n * st[3]:
            raise HybridStartupError(
                f"{name}: kernel blocks of {n} tokens (strides {cache.stride()}) do not form "
                f"one token axis of a {bs}-token block")
        x = torch.as_strided(x, (2, num_blocks, bs, h, hs), (st[0], st[1], st[3], st[4], st[5]),
                             x.storage_offset())
    return x


def state_views(name: str, cache: Any, spec: Any, num_blocks: int) -> list[torch.Tensor]:
    """A Mamba/GDN layer's state tensors ``[num_blocks, *shape]``, sliced from its
    ``[B, 1, 1, C]`` page view by vLLM's own ``MambaBase.bind_kv_cache``."""
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    nbytes = sum(prod(s) * d.itemsize for s, d in zip(spec.shapes, spec.dtypes, strict=True))
    if not isinstance(cache, torch.Tensor) or tuple(cache.shape) != (num_blocks, 1, 1, nbytes):
        shape = tuple(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise HybridStartupError(
            f"{name}: expected vLLM's [{num_blocks}, 1, 1, {nbytes}] state page view, got {shape}")
    layer = SimpleNamespace(get_state_shape=lambda: spec.shapes, get_state_dtype=lambda: spec.dtypes)
    MambaBase.bind_kv_cache(layer, cache)  # type: ignore[arg-type]
    return list(layer.kv_cache)
