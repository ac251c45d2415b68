"""Host pools for the SGLang tests.

* MAMBA: SGLang 0.5.23's own ``MambaPoolHost`` (``sglang.srt.mem_cache.pool_host.mamba``)
  in its ``page_first`` layout, built on CPU (``sglang_mamba_pool``). Its package
  ``__init__`` imports ``HostPoolGroup`` -> ``memory_pool`` -> ``sglang.srt.configs`` ->
  ``torchvision``, which has no build for the CPU torch here; ``mamba.py`` itself needs none
  of that. When the package does not import, it is registered bare (its directory as
  ``__path__``, its ``__init__`` not run) so SGLang's real ``mamba.py`` loads unchanged.
* KV: SGLang's ``MHATokenToKVPoolHost`` imports ``memory_pool`` itself, so it cannot be
  loaded here. ``KVHostPool`` reproduces the three calls a storage backend makes on it
  (``get_data_page``, ``get_dummy_flat_data_page``, ``set_from_flat_data_page``, plus
  ``page_size`` and ``layout``) for its ``page_first`` layout, ``kv_buffer[2, size, layer,
  head, dim]``: a page is ``page_size`` consecutive token slots, flattened in that order.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

_POOL_HOST = "sglang.srt.mem_cache.pool_host"


def _mamba_pool_host_class() -> Any:
    try:
        importlib.import_module(_POOL_HOST)
    except ImportError:
        import sglang.srt.mem_cache as mem_cache

        sys.modules.pop(_POOL_HOST, None)
        pkg = types.ModuleType(_POOL_HOST)
        pkg.__path__ = [str(Path(next(iter(mem_cache.__path__))) / "pool_host")]
        pkg.__package__ = _POOL_HOST
        sys.modules[_POOL_HOST] = pkg
    return importlib.import_module(f"{_POOL_HOST}.mamba").MambaPoolHost


def sglang_mamba_pool(slots: int, layers: int, temporal: Sequence[int],
                      convs: Sequence[Sequence[int]], temporal_dtype: torch.dtype = torch.float32,
                      conv_dtype: torch.dtype = torch.bfloat16, seed: int | None = 0) -> Any:
    """SGLang's ``MambaPoolHost`` (``page_first``, one state per slot) for a device pool of
    ``slots`` checkpoints; its buffers filled with random values unless ``seed`` is None."""
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo

    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, slots, *temporal, dtype=temporal_dtype),
        conv=tuple(torch.zeros(layers, slots, *c, dtype=conv_dtype) for c in convs))
    pool = _mamba_pool_host_class()(info, 2.0, 0, device_capacity=slots, pin_memory=False,
                                    layout="page_first")
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for buf in (pool.temporal_buffer, *pool.conv_buffer):
            buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))
    return pool


class KVHostPool:
    def __init__(self, size: int, page_size: int, layers: int, heads: int, dim: int,
                 dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> None:
        self.page_size, self.size, self.layout, self.dtype = page_size, size, "page_first", dtype
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(2, size, layers, heads, dim, generator=g).to(dtype)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[:, index : index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros_like(self.kv_buffer[:, : self.page_size]).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        shape = self.kv_buffer[:, index : index + self.page_size].shape
        self.kv_buffer[:, index : index + self.page_size] = data_page.reshape(shape)
