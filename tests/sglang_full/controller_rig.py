"""Building blocks of tests/sglang_full: SGLang 0.5.23's real device and host pools on
CPU, its real HiCache controllers with our backend loaded through its ``dynamic`` storage
factory, a recording subclass of ``HybridHiCacheStorage``, and the scheduler-side steps
(the radix tree's part) a test has to play to move a prefetch through the controller.

Imported only after the test module has checked that ``torchvision`` and
``sglang.srt.managers.cache_controller`` import (the .venv-sglang environment of
scripts/install_sglang_full.sh).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo, PoolName
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host import HostPoolGroup, PoolEntry
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.runtime_context import get_context, get_parallel

from hybrid_connector.integrations.sglang import HybridHiCacheStorage

PAGE = 4
LAYERS, HEADS, DIM = 2, 2, 8
DEVICE_TOKENS = 64
WAIT_S = 20.0


class RecordingStorage(HybridHiCacheStorage):
    """Our backend, unchanged, recording each storage call SGLang makes on it:
    ``(method, keys, prefix_keys of extra_info)`` (``prefix_keys`` None when absent).
    Only calls from outside are recorded: the backend's own delegation (``batch_set_v1``
    -> ``batch_set_v2``, ``batch_exists`` -> ``exists``) runs while ``_inner`` is set."""

    calls: list[tuple[str, list[str], list[str] | None]]

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        super().__init__(storage_config, kwargs)
        self.calls = []
        self._calls_lock = threading.Lock()
        self._inner = threading.local()

    def _note(self, method: str, keys: Any, extra_info: Any) -> None:
        if getattr(self._inner, "depth", 0):
            return
        prefix = getattr(extra_info, "prefix_keys", None)
        with self._calls_lock:
            self.calls.append((method, [str(k) for k in keys or ()],
                               None if prefix is None else list(prefix)))

    def _call(self, fn: Any, *args: Any) -> Any:
        self._inner.depth = getattr(self._inner, "depth", 0) + 1
        try:
            return fn(*args)
        finally:
            self._inner.depth -= 1

    def batch_exists(self, keys: list[str],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        self._note("batch_exists", keys, extra_info)
        return self._call(super().batch_exists, keys, extra_info)

    def batch_exists_v2(self, keys: Any, pool_transfers: Any = None,
                        extra_info: Any = None) -> Any:
        self._note("batch_exists_v2", keys, extra_info)
        return self._call(super().batch_exists_v2, keys, pool_transfers, extra_info)

    def batch_get_v1(self, keys: Any, host_indices: Any, extra_info: Any = None) -> Any:
        self._note("batch_get_v1", keys, extra_info)
        return self._call(super().batch_get_v1, keys, host_indices, extra_info)

    def batch_set_v1(self, keys: Any, host_indices: Any, extra_info: Any = None) -> Any:
        self._note("batch_set_v1", keys, extra_info)
        return self._call(super().batch_set_v1, keys, host_indices, extra_info)

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> Any:
        for t in transfers:
            self._note(f"batch_get_v2:{t.name}", t.keys, extra_info)
        return self._call(super().batch_get_v2, transfers, extra_info)

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> Any:
        for t in transfers:
            self._note(f"batch_set_v2:{t.name}", t.keys, extra_info)
        return self._call(super().batch_set_v2, transfers, extra_info)

    def batch_get(self, keys: Any, target_locations: Any = None,
                  target_sizes: Any = None) -> Any:
        self._note("batch_get", keys, None)
        return self._call(super().batch_get, keys, target_locations, target_sizes)

    def batch_set(self, keys: Any, values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> Any:
        self._note("batch_set", keys, None)
        return self._call(super().batch_set, keys, values, target_locations, target_sizes)


class SingleRankContext:
    """SGLang's own test hooks for a process with no published server config:
    ``get_context().override_server_args`` (HiCache page_first layout, direct io) and
    ``get_parallel().override`` for the ranks of a one-process, TP=PP=DCP=1 run."""

    def __enter__(self) -> SingleRankContext:
        self._args = get_context().override_server_args(
            hicache_mem_layout="page_first", hicache_io_backend="direct")
        self._args.__enter__()
        self._ranks = get_parallel().override(tp_rank=0, pp_rank=0, attn_dcp_rank=0)
        self._ranks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ranks.__exit__(*exc)
        self._args.__exit__(*exc)


def write_tiers(tmp_path: Path) -> str:
    """A tier config (host and NVMe pools, per kind) in ``tmp_path``; its path."""
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump({
        "local_cpu": True, "max_local_cpu_size": "8MB",
        "local_disk": str(tmp_path / "nvme"), "max_local_disk_size": "32MB",
        "disk_fsync": False,
        "pools": {"host": {"kv": "1KB", "state": "16KB"},  # KV pages are 512 B
                  "disk": {"kv": "8MB", "state": "4MB"}}}))
    return str(path)


def extra_config(config_file: str, **more: Any) -> dict[str, Any]:
    """``--hicache-storage-backend-extra-config`` of our backend (its recording twin)."""
    return {"backend_name": "hybrid", "module_path": __name__,
            "class_name": "RecordingStorage", "config_file": config_file, **more}


def kv_pools(layout: str = "page_first") -> tuple[PagedTokenToKVPoolAllocator,
                                                   MHATokenToKVPoolHost]:
    """A real ``MHATokenToKVPool`` on cpu, its paged allocator, and SGLang's
    ``MHATokenToKVPoolHost`` over it (``layout``, host = 2 x device, unpinned)."""
    kv = MHATokenToKVPool(size=DEVICE_TOKENS, page_size=PAGE, dtype=torch.bfloat16,
                          head_num=HEADS, head_dim=DIM, layer_num=LAYERS, device="cpu",
                          enable_memory_saver=False)
    alloc = PagedTokenToKVPoolAllocator(DEVICE_TOKENS, PAGE, torch.bfloat16, "cpu", kv,
                                        need_sort=False)
    info = kv.get_device_pool_infos()[0].buffer_info
    host = MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False,
                                device="cpu", device_capacity_tokens=kv.size,
                                start_layer=kv.start_layer, end_layer=kv.end_layer)
    return alloc, host


def mamba_host_pool(slots: int = 8) -> MambaPoolHost:
    """SGLang's ``MambaPoolHost`` (``page_first``) for a device state pool of ``slots``
    checkpoints whose buffers are CPU tensors (one temporal, one conv state per layer)."""
    info = MambaStateBufferInfo(
        temporal=torch.zeros(LAYERS, slots, 4, 8, dtype=torch.float32),
        conv=(torch.zeros(LAYERS, slots, 8, 4, dtype=torch.bfloat16),))
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False,
                         layout="page_first")


def base_controller(extra: dict[str, Any], layout: str = "page_first") -> HiCacheController:
    """SGLang's ``HiCacheController`` (KV only) with the ``dynamic`` backend attached at
    construction, as the scheduler builds it (no process groups: one rank)."""
    alloc, host = kv_pools(layout)
    return HiCacheController(alloc, host, PAGE, None, threading.Event(), io_backend="direct",
                             storage_backend="dynamic", model_name="tiny-hybrid",
                             storage_backend_extra_config=extra)


def hybrid_controller(extra: dict[str, Any]) -> HybridCacheController:
    """SGLang's ``HybridCacheController`` over a ``HostPoolGroup`` of the KV host pool
    (anchor) and a MAMBA ``MambaPoolHost``, the dynamic backend attached at construction
    (it registers both pools with ``register_mem_host_pool_v2``)."""
    alloc, host = kv_pools()
    mamba = mamba_host_pool()
    ident = lambda layer: layer  # noqa: E731
    group = HostPoolGroup([
        PoolEntry(name=PoolName.KV, host_pool=host, device_pool=alloc.get_kvcache(),
                  layer_mapper=ident, is_primary_index_anchor=True),
        PoolEntry(name=PoolName.MAMBA, host_pool=mamba, device_pool=None, layer_mapper=ident),
    ])
    return HybridCacheController(alloc, group, PAGE, None, threading.Event(),
                                 io_backend="direct", storage_backend="dynamic",
                                 model_name="tiny-hybrid", storage_backend_extra_config=extra,
                                 transfer_layer_id_max=LAYERS)


def fill(buf: torch.Tensor, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))


def kv_bytes(host: MHATokenToKVPoolHost, indices: torch.Tensor) -> bytes:
    """The host KV bytes of the token slots ``indices`` (page_first: [2, slot, ...])."""
    return host.kv_buffer[:, indices].contiguous().view(torch.uint8).numpy().tobytes()


def _arrivals(q: Any) -> Iterator[Any]:
    """The items put on the queue ``q``, as they arrive, for ``WAIT_S`` seconds."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            yield q.get(timeout=0.2)
        except queue.Empty:
            continue


def wait_backup(cc: HiCacheController, op_id: int) -> Any:
    """The backup thread's ack of write ``op_id`` (the tree's ``writing_check`` drain)."""
    for op in _arrivals(cc.ack_backup_queue):
        if op.id == op_id:
            return op
    raise TimeoutError(f"no backup ack for operation {op_id}")


def wait_hit(cc: HiCacheController) -> Any:
    """The prefetch thread's hit-query verdict (what the tree drains before allocating)."""
    return cc.prefetch_hit_queue.get(timeout=WAIT_S)


def wait_prefetch_done(cc: HiCacheController, rid: str) -> list[Any]:
    """Every ack of prefetch ``rid`` up to the ``completed_req`` one."""
    acks = []
    for ack in _arrivals(cc.ack_prefetch_queue):
        if ack.rid == rid:
            acks.append(ack)
            if ack.completed_req:
                return acks
    raise TimeoutError(f"prefetch {rid} did not complete")
