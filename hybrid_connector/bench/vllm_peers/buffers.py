"""vLLM 0.33.0's own KV buffers on CPU, per attention backend and layout.

The GPU model runner (``gpu_model_runner.py``: ``initialize_kv_cache`` then
``initialize_kv_cache_tensors``) builds the per-layer views with
``vllm.v1.worker.utils.allocate_kv_cache``: one int8 backing allocation that every KV
cache group aliases, viewed per layer as ``[B, H, N, C]`` in the resolved
``KVCacheLayout``'s stride order (attention: ``C`` is the K and V content of one token
and head, in the spec's dtype; a Mamba layer: ``[B, 1, 1, state bytes]`` int8 inside its
padded page). Those views are what ``register_kv_caches`` receives. Here they are made by
the same functions on a CPU device (the only stand-in), with the kernel block sizes from
``prepare_kernel_block_sizes`` and the layout from vLLM's ``resolve_kv_cache_layout``.

How a layer reads them is the backend's and the layer's own code, quoted here so the
harness reads and writes tokens and states the way a model would, independently of the
connector: FlashAttention / Triton / FlexAttention / FlashInfer split the content dim
(``kv_cache.transpose(1, 2).split(head_size, dim=-1)``), CPU attention views a head's
``[N, 2 * head_size]`` page as ``[2 * N, head_size]`` (K rows, then V rows), and a Mamba
layer slices its page with ``MambaBase.bind_kv_cache``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch

# the backends vLLM 0.33 picks for a full-attention layer of a supported hybrid (Nemotron-H,
# Qwen3-Next/3.5: GQA with equal K and V head sizes; none uses MLA)
BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "CPU_ATTN")


def backend_class(name: str) -> Any:
    """The backend class from vLLM's registry; ``ImportError`` (and friends) where this
    CPU install cannot import it (FlashInfer: no ``flashinfer`` package for CPU)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


@contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def hybrid_layouts(vc: Any, backend: Any, specs: dict[str, Any]) -> list[str]:
    """Every ``KVCacheLayout`` vLLM's engine core resolves for ``backend`` on a model with
    these layer specs (``resolve_kv_cache_layout`` with ``VLLM_KV_CACHE_LAYOUT`` set to
    each; a hybrid's mixed page shapes narrow it to block-compact layouts)."""
    import copy

    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout

    names = [x.name for x in get_supported_kv_cache_layouts([backend])]
    out = []
    for layout in KVCacheLayout:
        c = copy.deepcopy(vc)
        c.cache_config.kv_cache_layout = None
        with _env("VLLM_KV_CACHE_LAYOUT", layout.name):
            try:
                got = resolve_kv_cache_layout(c, [names], specs.values())
            except ValueError:
                continue
        out.append(got.name)
    return out


def allocate(cfg: Any, layout: str, backend: Any, seed: int = 0,
             kernel_block: int | None = None) -> dict[str, torch.Tensor]:
    """``register_kv_caches``'s argument as vLLM's GPU model runner makes it for ``cfg``
    (planned under the same resolved ``layout``), on CPU, with the backing bytes random.
    ``kernel_block``: the attention groups' kernel block size where the backend would
    split blocks (default: ``prepare_kernel_block_sizes``'s choice for ``backend``)."""
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import AttentionGroup, allocate_kv_cache, prepare_kernel_block_sizes

    groups = [[AttentionGroup(backend, list(g.layer_names), g.kv_cache_spec, i)]
              if isinstance(g.kv_cache_spec, AttentionSpec) else []
              for i, g in enumerate(cfg.kv_cache_groups)]
    kernel = prepare_kernel_block_sizes(cfg, groups)
    if kernel_block is not None:
        kernel = [kernel_block if grp else k for k, grp in zip(kernel, groups, strict=True)]
    caches = allocate_kv_cache(cfg, torch.device("cpu"), KVCacheLayout[layout], kernel)
    raw = backing(caches)
    raw.copy_(torch.randint(-128, 128, raw.shape, dtype=torch.int8,
                            generator=torch.Generator().manual_seed(seed)))
    return caches


def backing(caches: dict[str, torch.Tensor]) -> torch.Tensor:
    """The one int8 allocation every view aliases (asserted)."""
    storages = {t.untyped_storage().data_ptr() for t in caches.values()}
    assert len(storages) == 1, "vLLM's views share one backing allocation"
    t = next(iter(caches.values()))
    return torch.empty(0, dtype=torch.int8).set_(t.untyped_storage())


def kv_planes(backend: str, cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V), each ``[blocks, block_size, heads, head_size]``, viewed the way the
    backend's forward reads ``cache`` (see the module docstring)."""
    if backend == "CPU_ATTN":  # cpu_attn.py, CPUAttentionBackendImpl.forward
        num_blocks, num_kv_heads, block_size, _ = cache.size()
        kv = cache.view((num_blocks, num_kv_heads, block_size * 2, -1))
        k, v = kv.chunk(2, dim=2)
        return k.transpose(1, 2), v.transpose(1, 2)
    k, v = cache.transpose(1, 2).split(head_size, dim=-1)  # flash_attn.py et al.
    return k, v


def state_views(spec: Any, cache: torch.Tensor) -> list[torch.Tensor]:
    """A Mamba layer's state tensors ``[blocks, *shape]``, sliced from its page view by
    vLLM's own ``MambaBase.bind_kv_cache`` (on a stand-in layer carrying the spec)."""
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    layer = SimpleNamespace(get_state_shape=lambda: spec.shapes, get_state_dtype=lambda: spec.dtypes)
    MambaBase.bind_kv_cache(layer, cache)  # type: ignore[arg-type]
    return list(layer.kv_cache)


class StandInLayer:
    """What the connector asks of a model's attention layer: its backend (picklable, so a
    config carrying it still reaches a worker process)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def get_attn_backend(self) -> Any:
        return backend_class(self.backend)


def bind_backend(vc: Any, cfg: Any, backend: Any) -> None:
    """Stand in for the model's attention layers in ``vc``'s static forward context (where
    a real engine registers them), so the connector finds each layer's backend there."""
    from vllm.v1.kv_cache_interface import AttentionSpec

    ctx = vc.compilation_config.static_forward_context
    for g in cfg.kv_cache_groups:
        if isinstance(g.kv_cache_spec, AttentionSpec):
            for name in g.layer_names:
                ctx[name] = StandInLayer(backend.get_name())
