"""Host pools with SGLang 0.5.23's page API, for tests.

SGLang's own host pools (``sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost``,
``pool_host.mamba.MambaPoolHost``) cannot be imported on this CPU install: their package
imports ``memory_pool`` -> ``sglang.srt.configs`` -> ``torchvision``, which has no build for
the CPU torch here. These classes reproduce the three calls a storage backend makes
(``get_data_page``, ``get_dummy_flat_data_page``, ``set_from_flat_data_page``, plus
``page_size`` and ``layout``) with the same buffer layouts as those classes:

* ``KVHostPool``: ``page_first``, ``kv_buffer[2, size, layer, head, dim]``; a page is
  ``page_size`` consecutive token slots, flattened in that order (a tensor of the KV dtype).
* ``MambaHostPool``: ``page_first``, one slot per page (``page_size`` 1): the temporal
  (SSM) state ``[size, layer, ...]`` then each conv state ``[size, layer, ...]``, each
  flattened to bytes and concatenated (a ``uint8`` tensor).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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


class MambaHostPool:
    def __init__(self, size: int, layers: int, temporal: Sequence[int],
                 convs: Sequence[Sequence[int]], seed: int = 0,
                 conv_dtype: torch.dtype = torch.bfloat16) -> None:
        self.page_size, self.size, self.layout = 1, size, "page_first"
        g = torch.Generator().manual_seed(seed)
        self.temporal_buffer = torch.randn(size, layers, *temporal, generator=g)
        self.conv_buffer = [torch.randn(size, layers, *c, generator=g).to(conv_dtype)
                            for c in convs]

    def _tensors(self, index: int) -> list[torch.Tensor]:
        return [self.temporal_buffer[index], *(c[index] for c in self.conv_buffer)]

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        return torch.cat([t.contiguous().view(torch.uint8).reshape(-1)
                          for t in self._tensors(index)])

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros_like(self.get_data_page(0))

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        flat, start = data_page.contiguous().view(torch.uint8).reshape(-1), 0
        for t in self._tensors(index):
            n = t.numel() * t.element_size()
            t.copy_(flat[start : start + n].clone().view(t.dtype).reshape(t.shape))
            start += n
