"""Building blocks of the SGLang tests: storage configs, a backend built the way SGLang's
``dynamic`` factory builds it, host pools registered as SGLang registers them, page hashes
from SGLang's own hash function, and the v2 transfers SGLang sends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from host_pools import KVHostPool, sglang_mamba_pool
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str

PAGE = 4
TIERS = ("host", "nvme", "remote")
DYNAMIC = {"backend_name": "hybrid", "module_path": "hybrid_connector.integrations.sglang",
           "class_name": "HybridHiCacheStorage"}


def storage_config(extra: dict[str, Any], tp_rank: int = 0, tp_size: int = 1,
                   model: str = "tiny-hybrid") -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
        is_page_first_layout=True, model_name=model, extra_config=extra)


def pools(seed: int = 0, kv_pages: int = 32, slots: int = 8) -> tuple[KVHostPool, Any]:
    """A KV host pool (512 B pages of 4 tokens) and SGLang's own MAMBA host pool (640 B
    slots; at least ``slots``: SGLang sizes it from the device pool)."""
    kv = KVHostPool(kv_pages * PAGE, PAGE, layers=2, heads=2, dim=8, seed=seed)
    mamba = sglang_mamba_pool(slots, layers=2, temporal=(8, 8), convs=[(8, 4)], seed=seed + 1)
    assert mamba.get_data_page(0).numel() == 640
    return kv, mamba


def register(backend: HiCacheStorage, kv: KVHostPool, mamba: Any) -> None:
    """As SGLang's hybrid controller does: the anchor pool, then each v2 pool."""
    backend.register_mem_pool_host(kv)  # type: ignore[arg-type]
    backend.register_mem_host_pool_v2(kv, PoolName.KV)  # type: ignore[arg-type]
    backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)  # type: ignore[arg-type]
    backend.on_host_pools_registered()


def dynamic_backend(overrides: dict[str, Any], **kw: Any) -> HiCacheStorage:
    """Our backend through SGLang's own factory (``--hicache-storage-backend dynamic``)."""
    extra = {**DYNAMIC, "overrides": overrides}
    return StorageBackendFactory.create_backend("dynamic", storage_config(extra, **kw), None)


def page_hashes(tokens: list[int]) -> list[str]:
    """SGLang's chained page hashes of ``tokens`` (full pages only)."""
    out = get_hash_str(tokens, None, page_size=PAGE)
    assert isinstance(out, list)
    return out


def kv_transfer(hashes: list[str], first_page: int) -> PoolTransfer:
    idx = torch.arange(first_page * PAGE, (first_page + len(hashes)) * PAGE, dtype=torch.int64)
    return PoolTransfer(name=PoolName.KV, host_indices=idx, keys=list(hashes))


def state_transfer(last_hash: str, slot: int | None) -> PoolTransfer:
    """A MAMBA transfer keyed by the last KV page it covers (trailing-pages policy)."""
    idx = None if slot is None else torch.tensor([slot], dtype=torch.int64)
    return PoolTransfer(name=PoolName.MAMBA, host_indices=idx, keys=[last_hash],
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)


def kv_bytes(kv: KVHostPool, first_page: int, n: int) -> bytes:
    return kv.kv_buffer[:, first_page * PAGE : (first_page + n) * PAGE].contiguous() \
        .view(torch.uint8).numpy().tobytes()


def slot_bytes(mamba: Any, slot: int) -> bytes:
    return mamba.get_data_page(slot).numpy().tobytes()


def tier_overrides(tier: str, tmp_path: Path, redis: Callable[[], str],
                   kv: str = "4MB", state: str = "1MB") -> dict[str, Any]:
    """``load_config`` overrides with ``tier`` as the only tier (budgets per kind)."""
    budget = {"kv": kv, "state": state}
    if tier == "host":
        return {"pools": {"host": budget}}
    if tier == "nvme":
        return {"local_cpu": False, "local_disk": str(tmp_path / "nvme"),
                "max_local_disk_size": "64MB", "disk_fsync": False, "pools": {"disk": budget}}
    if tier == "remote":
        return {"local_cpu": False, "remote_url": redis(), "pools": {"remote": budget}}
    raise ValueError(tier)
