"""vLLM 0.33's align-mode Mamba manager does not touch the local-hit state block that a
connector's external tokens make it skip (``docs/vllm_peers.md``, "Where ours loses"), and
``benchmarks/vllm_lru_refresh.py``'s what-if change moves that block to the most-recent end
of vLLM's free queue while holding nothing. Real vLLM ``BlockPool`` and ``MambaManager``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from script_loader import load_script

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from vllm.v1.core import single_type_kv_cache_manager as stm  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id  # noqa: E402
from vllm.v1.kv_cache_interface import MambaSpec  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_lru_refresh.py"


def _cached_pool() -> tuple[BlockPool, stm.MambaManager, list[Any]]:
    """A pool of 8 blocks whose blocks 1-3 hold cached states (free, oldest first)."""
    spec = MambaSpec(block_size=32, shapes=((4,),), dtypes=(torch.float32,),
                     mamba_cache_mode="align")
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=32)
    mgr = stm.MambaManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0,
                           scheduler_block_size=32)
    blocks = pool.get_new_blocks(3)
    for i, b in enumerate(blocks):
        b.set_block_hash(make_block_hash_with_group_id(BlockHash(bytes([i]) * 32), 0))
    pool.free_blocks(blocks)
    return pool, mgr, blocks


def _free_order(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_vllm_takes_its_state_block_for_a_local_hit_alone() -> None:
    pool, mgr, blocks = _cached_pool()
    mgr.add_local_computed_blocks("r", [mgr._null_block, blocks[1]], 64, 0)
    assert blocks[1].ref_cnt == 1 and blocks[1].block_id not in _free_order(pool)


def test_external_tokens_past_the_hit_leave_vllms_state_block_untouched() -> None:
    pool, mgr, blocks = _cached_pool()
    before = _free_order(pool)
    mgr.add_local_computed_blocks("r", [mgr._null_block, blocks[1]], 64, 9)
    assert blocks[1].ref_cnt == 0 and _free_order(pool) == before  # no LRU refresh


def test_the_what_if_change_refreshes_it_and_holds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = stm.SingleTypeKVCacheManager
    monkeypatch.setattr(cls, "add_local_computed_blocks",
                        load_script(BENCH).refreshing(cls.add_local_computed_blocks))
    pool, mgr, blocks = _cached_pool()
    before = _free_order(pool)
    mgr.add_local_computed_blocks("r", [mgr._null_block, blocks[1]], 64, 9)
    after = _free_order(pool)
    assert blocks[1].ref_cnt == 0 and sorted(after) == sorted(before)
    assert after[-1] == blocks[1].block_id and after[:-1] == [b for b in before if b != after[-1]]
    assert all(b.is_null for b in mgr.req_to_blocks["r"])  # the request holds nothing
