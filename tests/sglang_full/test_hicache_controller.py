"""SGLang 0.5.23's real HiCache controllers, on CPU, with ``HybridHiCacheStorage`` as their
L3 storage backend (issue 13).

Runs only in .venv-sglang (``scripts/test_sglang_full.sh``): the controllers and host pools
import ``sglang.srt.configs`` -> ``torchvision``, which does not import beside the main
venv's CPU torch 2.13.0; there the module skips.

Exercised, all of it SGLang's own code on ``device="cpu"``:

* ``MHATokenToKVPool`` (device pool), ``PagedTokenToKVPoolAllocator``,
  ``MHATokenToKVPoolHost`` (``page_first``) and ``MambaPoolHost`` (``page_first``);
* ``HiCacheController`` and ``HybridCacheController`` built with
  ``storage_backend="dynamic"`` and our extra config, so SGLang's ``StorageBackendFactory``
  imports and builds the backend (a recording subclass, ``controller_rig.RecordingStorage``)
  and the controller registers its host pools on it (``register_mem_pool_host``, and for the
  hybrid controller ``register_mem_host_pool_v2`` per pool);
* the storage threads: ``write_storage`` -> ``backup_thread_func`` -> ``_page_backup``
  (legacy ``batch_set``, or ``batch_set_v1`` with ``interface_v1``; the hybrid controller's
  MAMBA sidecar through ``batch_set_v2``), and ``prefetch`` -> ``prefetch_thread_func``
  (``_storage_hit_query``: ``batch_exists``, or ``batch_exists_v2`` with a MAMBA transfer)
  -> ``prefetch_io_aux_func`` -> ``_page_transfer`` (``batch_get``/``batch_get_v1``, MAMBA
  through ``batch_get_v2``) -> ``prefetch_sync_thread_func`` (acks, no process groups);
* ``hicache_storage_pass_prefix_keys``: parsed from the extra config JSON by SGLang's
  ``HybridCacheController.parse_storage_backend_extra_config``; the test then passes
  ``prefix_keys`` as the radix tree does when it is set, and checks each call's
  ``extra_info.prefix_keys`` at our backend.

Not exercised (and why):

* the radix tree above the controller. SGLang 0.5.23 has no ``HiMambaRadixCache`` class:
  that role is ``UnifiedRadixCache`` with a MAMBA tree component
  (``mem_cache/unified_radix_cache.py:199``), built from ``CacheInitParams`` (a hybrid
  ``ReqToTokenPool`` with its device state pool, tree components) and driven by
  scheduler ``Req`` objects; building that was not attempted here. The test plays the
  tree's part of the storage flow instead: ``write_storage`` with the node's hashes,
  prefix and MAMBA transfer (as at ``unified_radix_cache.py:2010``), and for a storage
  hit fresh host slots and ``prefetch_buffer.put`` (as at ``unified_radix_cache.py:3150``),
  then the ack queues it drains;
* device <-> host transfers (``write``/``load``/``start_writing``/``start_loading``): the
  host pools' transfer kernels are sgl_kernel CUDA ops (``memory_pool_host.py`` imports them
  only under ``_is_cuda or _is_hip``), and the L2 path records ``device_module`` (CUDA)
  events; the test fills host pages directly instead;
* TP/PP/DCP reductions: one rank, so ``_create_sync_groups`` makes no gloo groups.

No SGLang internals are patched. The one piece of process state set up is SGLang's own test
hook: ``get_context().override_server_args`` and ``get_parallel().override`` (ranks 0 of a
one-rank run), without which ``attach_storage_backend`` fails at
``managers/cache_controller.py:551`` (``get_parallel().attn_dcp_size``: "nothing is
published").
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:  # torchvision first: importing the controller without it would half-import SGLang
    importlib.import_module("torchvision")
    importlib.import_module("sglang.srt.managers.cache_controller")
except Exception as e:  # noqa: BLE001 - any failure means "not this environment"
    pytest.skip(f"SGLang's HiCacheController does not import here ({type(e).__name__}: {e}); "
                "run scripts/test_sglang_full.sh (.venv-sglang)", allow_module_level=True)

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    HybridCacheController,
)
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import controller_rig as rig  # noqa: E402

TOKENS = list(range(100, 100 + 6 * rig.PAGE))  # six full pages


@pytest.fixture
def single_rank() -> Iterator[None]:
    with rig.SingleRankContext():
        yield


def _start(cc: Any) -> rig.RecordingStorage:
    backend = cc.storage_backend
    assert isinstance(backend, rig.RecordingStorage)
    return backend


def _write_then_prefetch(cc: Any, prefix: list[str] | None, extra_write: Any = None,
                         extra_read: Any = None, rid: str = "r0") -> tuple[Any, Any, Any]:
    """Fill host KV pages, back them up through the controller, then prefetch them into
    fresh host slots; returns (written host indices, prefetch operation, new indices)."""
    host = cc.mem_pool_host if not isinstance(cc, HybridCacheController) else cc.storage_host_pool
    hashes = get_storage_hash_str(TOKENS, None, page_size=rig.PAGE)
    src = host.alloc(len(TOKENS))
    assert src is not None
    rig.fill(host.kv_buffer, seed=7)
    kw = {} if extra_write is None else {"extra_pools": extra_write}
    op = rig.wait_backup(cc, cc.write_storage(src, TOKENS, hashes, prefix, **kw))
    assert op.completed_tokens == len(TOKENS)
    backend = cc.storage_backend
    placed = backend.store.where([backend.keys.key("kv", h) for h in hashes])
    assert set(placed) == {"host", "nvme"}, placed  # the 1KB host KV pool spills to NVMe

    before = rig.kv_bytes(host, src)
    assert any(before)
    handle: Any = rid if not isinstance(cc, HybridCacheController) else CacheRequestHandle(rid, 0)
    kw = {} if extra_read is None else {"extra_pools": extra_read}
    pf = cc.prefetch(handle, TOKENS, None, prefix, **kw)
    pf = rig.wait_hit(cc)
    assert pf.storage_hit_count == len(TOKENS)
    dst = host.alloc(pf.storage_hit_count)  # the tree's allocate_storage_hit, fresh slots
    assert dst is not None and not set(dst.tolist()) & set(src.tolist())
    host.kv_buffer[:, dst] = 0
    host.kv_buffer[:, src] = 0  # nothing left to copy from on the host
    pf.host_indices = dst
    return before, pf, dst


@pytest.mark.parametrize("interface_v1", [False, True], ids=["legacy-get-set", "v1-zero-copy"])
def test_base_controller_backs_up_and_prefetches_kv(tmp_path: Path, single_rank: None,
                                                    interface_v1: bool) -> None:
    """KV only, ``HiCacheController``: backup and prefetch through our backend, bit-exact."""
    extra = rig.extra_config(rig.write_tiers(tmp_path), **({"interface_v1": 1}
                                                            if interface_v1 else {}))
    cc = rig.base_controller(extra)
    try:
        backend = _start(cc)
        assert cc.page_get_func.__name__ == ("_page_get_zero_copy" if interface_v1
                                             else "_generic_page_get")
        before, pf, dst = _write_then_prefetch(cc, None)
        cc.prefetch_buffer.put(pf)
        acks = rig.wait_prefetch_done(cc, "r0")
        assert max(a.completed_tokens or 0 for a in acks) == len(TOKENS)
        assert rig.kv_bytes(cc.mem_pool_host, dst) == before
        methods = {m for m, _, _ in backend.calls}
        assert methods >= ({"batch_set_v1", "batch_get_v1"} if interface_v1
                           else {"batch_set", "batch_get"})
    finally:
        cc.detach_storage_backend()


def test_hybrid_controller_kv_and_mamba_with_prefix_keys(tmp_path: Path,
                                                         single_rank: None) -> None:
    """``HybridCacheController`` over KV + MAMBA host pools: the state rides the v2 calls
    next to its last KV page, both land bit-exact in fresh host slots, and with
    ``hicache_storage_pass_prefix_keys`` every call carries the prefix before its keys."""
    raw = json.dumps({**rig.extra_config(rig.write_tiers(tmp_path)),
                      "hicache_storage_pass_prefix_keys": True, "interface_v1": 1,
                      # FLOP-aware eviction on, so the backend keeps the page chain
                      "overrides": {"tier_eviction": "value", "model": "qwen3.5-4b"}})
    extra, _, _, _, pass_prefix = HybridCacheController.parse_storage_backend_extra_config(raw)
    assert pass_prefix is True and "hicache_storage_pass_prefix_keys" not in extra
    cc = rig.hybrid_controller(extra)
    try:
        backend = _start(cc)
        assert set(backend.registered_pools) >= {"kv", "mamba"}
        mamba = cc.mem_pool_host.entry_map[PoolName.MAMBA].host_pool
        hashes = get_storage_hash_str(TOKENS, None, page_size=rig.PAGE)
        prefix = ["parent-page-a", "parent-page-b"]  # the node's ancestors' page hashes
        slot = mamba.alloc(1)
        rig.fill(mamba.temporal_buffer, seed=11)
        for conv in mamba.conv_buffer:
            rig.fill(conv, seed=12)
        state = mamba.get_data_page(int(slot[0])).clone()
        write_state = [PoolTransfer(name=PoolName.MAMBA, host_indices=slot, keys=[hashes[-1]],
                                    hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        read_state = [PoolTransfer(name=PoolName.MAMBA, keys=[hashes[-1]],
                                   hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        before, pf, dst = _write_then_prefetch(cc, prefix, write_state, read_state)
        new_slot = mamba.alloc(1)
        assert int(new_slot[0]) != int(slot[0])
        mamba.temporal_buffer.zero_()
        for conv in mamba.conv_buffer:
            conv.zero_()
        pf.pool_transfers[0].host_indices = new_slot
        cc.prefetch_buffer.put(pf)
        acks = rig.wait_prefetch_done(cc, "r0")
        assert max(a.completed_tokens or 0 for a in acks) == len(TOKENS)
        assert any((a.pool_hits or {}).get("mamba") == 1 for a in acks)
        assert rig.kv_bytes(cc.storage_host_pool, dst) == before
        assert torch.equal(mamba.get_data_page(int(new_slot[0])).view(torch.uint8),
                           state.view(torch.uint8))
        _check_prefix_keys(backend.calls, prefix, hashes)
        # the FLOP-aware eviction's page chain, learned from the controller's own calls
        from hybrid_connector.integrations.sglang.keys import hash_bytes

        chain = backend.chain
        assert [chain.depth(hash_bytes(h)) for h in hashes] == [
            len(prefix) + i + 1 for i in range(len(hashes))]
        assert [chain.states_below(hash_bytes(h)) for h in hashes] == [1] * len(hashes)
        chain.check_integrity()
    finally:
        cc.detach_storage_backend()


def _check_prefix_keys(calls: list[tuple[str, list[str], list[str] | None]],
                       prefix: list[str], hashes: list[str]) -> None:
    """Each call's prefix_keys is the request prefix plus the chain before its keys."""
    seen = {m for m, _, _ in calls}
    assert {"batch_set_v1", "batch_set_v2:mamba", "batch_exists_v2", "batch_get_v1",
            "batch_get_v2:mamba"} <= seen, seen
    for method, keys, got in calls:
        first = hashes.index(keys[0])
        assert got == prefix + hashes[:first], (method, keys, got)


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct", "page_first"])
def test_device_to_host_transfer_is_not_drivable_on_cpu(tmp_path: Path, single_rank: None,
                                                        layout: str) -> None:
    """Documents why device <-> host (L2) transfers are not exercised: on CPU the host
    pool's copy kernels are never bound (``pool_host/mha.py:60-83`` imports them from
    sgl_kernel only for CUDA/HIP, from ``_kvcacheio`` only for XPU), so ``write`` fails
    with a NameError at ``pool_host/mha.py:677`` (``transfer_kv_direct``, layer_first) or
    ``:686`` (``transfer_kv_all_layer_direct_lf_pf``, page_first_direct), which
    ``l2_transfer.py:123`` then masks with an AttributeError (``torch.cpu.Stream`` has no
    ``synchronize``); ``page_first``, the storage layout, is refused for the ``direct`` io
    backend at ``managers/cache_controller.py:961``. If this starts passing, SGLang can
    move pages on CPU and the tests above should go through ``write``/``load`` instead."""
    cc = rig.base_controller(rig.extra_config(rig.write_tiers(tmp_path)), layout=layout)
    try:
        device_indices = cc.mem_pool_device_allocator.alloc(2 * rig.PAGE)
        if layout == "page_first":
            with pytest.raises(ValueError, match="Unsupported layout 'page_first'"):
                cc.write(device_indices)
            return
        with pytest.raises(AttributeError, match="synchronize") as info:
            cc.write(device_indices)
        kernel = "transfer_kv_direct" if layout == "layer_first" \
            else "transfer_kv_all_layer_direct_lf_pf"
        assert isinstance(info.value.__context__, NameError)
        assert kernel in str(info.value.__context__)
    finally:
        cc.detach_storage_backend()
