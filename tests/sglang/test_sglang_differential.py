"""Differential test: our backend and SGLang's own ``HiCacheFile`` answer one sequence of
SGLang calls the same way, and the host pools end up byte-identical.

Where ours is deliberately different, the test says so and checks both sides:

1. Under capacity pressure ``HiCacheFile`` keeps one LRU over all files. SGLang's hybrid
   controller writes a request's MAMBA state before its KV pages, so the state is the
   oldest file and goes first, leaving KV pages no lookup can use (dead memory, SGLang
   #39436). Ours keeps states in their own pool: KV pressure drops whole KV runs, never a
   state, and no unusable page is left behind.
2. The host-pool layout is part of our keys: a page written from a ``page_first`` pool is
   not served to a ``layer_first`` pool (its bytes are in another order). ``HiCacheFile``
   keys without the layout and reports a hit.
3. Pools other than KV and MAMBA (SWA, indexer, ...) are misses in ours; ``HiCacheFile``
   stores any pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheFile,
    HiCacheStorage,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang_helpers import (  # noqa: E402
    PAGE,
    dynamic_backend,
    kv_transfer,
    page_hashes,
    pools,
    register,
    state_transfer,
    storage_config,
)

from hybrid_connector.integrations.sglang import HybridHiCacheStorage  # noqa: E402

KV_PAGE, STATE = 512, 640  # bytes of one page of ``pools()`` and of one MAMBA slot


def _pair(tmp_path: Path, file_extra: dict[str, Any], ours: dict[str, Any]) -> list[HiCacheStorage]:
    theirs = HiCacheFile(storage_config({"file_storage_path": str(tmp_path / "file"), **file_extra}))
    return [theirs, dynamic_backend(ours)]


def _normal(result: Any) -> Any:
    """Results with pool names as plain strings (``PoolName`` is a str enum)."""
    if isinstance(result, dict):
        return {str(getattr(k, "value", k)): v for k, v in result.items()}
    return (result.kv_hit_pages, _normal(result.extra_pool_hit_pages),
            result.restorable_prefix_pages)


def _script(b: HiCacheStorage) -> tuple[list[Any], bytes]:
    """One conversation and a stranger, as SGLang's controller would call a backend."""
    kv, mamba = pools()
    register(b, kv, mamba)
    turn = page_hashes(list(range(3, 3 + 6 * PAGE)))
    other = page_hashes(list(range(900, 900 + 3 * PAGE)))
    trail = [state_transfer(turn[-1], None)]
    out: list[Any] = [
        b.batch_exists_v2(turn, trail),                          # cold
        b.batch_set_v2([state_transfer(turn[1], 0), kv_transfer(turn[:2], 0)]),
        b.batch_exists_v2(turn, trail),                          # KV 2, state at 2
        b.batch_set_v2([state_transfer(turn[3], 1), kv_transfer(turn[:4], 0)]),  # rewrite 0-1
        b.batch_exists_v2(turn, trail),                          # restorable at 2 and 4
        b.batch_exists_v2(turn[:3], [state_transfer(turn[2], None)]),
        b.batch_get_v2([kv_transfer(turn[:4], 10), state_transfer(turn[3], 5)]),
        b.batch_get_v2([kv_transfer(turn[:2], 20), state_transfer(turn[1], 6)]),
        b.batch_get_v2([kv_transfer(other, 24)]),                # never stored
        b.batch_set_v2([kv_transfer(other, 4)]),                 # KV only, no state
        b.batch_exists_v2(other, [state_transfer(other[-1], None)]),
        b.batch_exists_v2(other),
        b.batch_exists(turn), b.exists(turn[0]), b.exists("f" * 64),
    ]
    pages = kv.kv_buffer.contiguous().view(torch.uint8).numpy().tobytes()
    return [_normal(r) if not isinstance(r, int | bool) else r for r in out], \
        pages + mamba.get_data_page(5).numpy().tobytes() + mamba.get_data_page(6).numpy().tobytes()


def test_same_calls_same_answers_and_same_bytes(tmp_path: Path) -> None:
    theirs, ours = _pair(tmp_path, {}, {"pools": {"host": {"kv": "1MB", "state": "1MB"}}})
    answers_theirs, bytes_theirs = _script(theirs)
    answers_ours, bytes_ours = _script(ours)
    assert answers_ours == answers_theirs
    assert bytes_ours == bytes_theirs
    assert answers_ours[4] == (4, {"kv": 4, "mamba": 4}, [2, 4])
    ours.close()


def test_under_pressure_ours_leaves_no_dead_kv_behind_an_evicted_state(tmp_path: Path) -> None:
    """Three requests of 4 pages plus a state each. ``HiCacheFile`` capped at 8 pages and 2
    states plus 3 pages; ours with pools of exactly 8 pages and 2 states (less room)."""
    theirs, ours = _pair(tmp_path, {"max_size": 11 * KV_PAGE + 2 * STATE},
                         {"pools": {"host": {"kv": 8 * KV_PAGE, "state": 2 * STATE}}})
    reqs = [page_hashes(list(range(1000 * r, 1000 * r + 4 * PAGE))) for r in range(3)]
    held: dict[str, list[list[bool]]] = {}
    for name, b in (("theirs", theirs), ("ours", ours)):
        kv, mamba = pools()
        register(b, kv, mamba)
        for r, hs in enumerate(reqs):
            assert _normal(b.batch_set_v2([state_transfer(hs[-1], r), kv_transfer(hs, 4 * r)])) \
                == {"mamba": [True], "kv": [True] * 4}
        hits = [b.batch_exists_v2(hs, [state_transfer(hs[-1], None)]).kv_hit_pages for hs in reqs]
        assert hits == [0, 4, 4]  # the same usable hits on both sides
        held[name] = [[b.exists(x) for x in hs] for hs in reqs]
    # HiCacheFile: request 0's state went first; three of its KV pages stay, unusable.
    assert held["theirs"][0] == [False, True, True, True]
    # Ours: request 0's KV run went with it; nothing unusable is held.
    assert held["ours"][0] == [False] * 4
    assert ours.store.where([ours.keys.key("mamba", reqs[0][-1])]) == [None]  # type: ignore[attr-defined]
    assert held["ours"][1:] == held["theirs"][1:] == [[True] * 4] * 2
    ours.close()


def test_a_page_written_in_one_layout_is_not_served_to_another(tmp_path: Path) -> None:
    theirs, ours = _pair(tmp_path, {}, {"pools": {"host": {"kv": "1MB", "state": "1MB"}}})
    hashes = page_hashes(list(range(2 * PAGE)))
    for b in (theirs, ours):
        kv, mamba = pools()
        register(b, kv, mamba)
        b.batch_set_v2([kv_transfer(hashes, 0)])
    # A second backend of the same model whose KV host pool is layer_first.
    other_file = HiCacheFile(storage_config({"file_storage_path": str(tmp_path / "file")}))
    assert isinstance(ours, HybridHiCacheStorage)
    other_ours = HybridHiCacheStorage(storage_config({}), store=ours.store)
    for b in (other_file, other_ours):
        kv, mamba = pools()
        kv.layout = "layer_first"
        register(b, kv, mamba)
    assert other_file.batch_exists_v2(hashes).kv_hit_pages == 2  # wrong order, served
    assert other_ours.batch_exists_v2(hashes).kv_hit_pages == 0
    ours.close()


def test_pools_other_than_kv_and_mamba_are_misses_in_ours(tmp_path: Path) -> None:
    theirs, ours = _pair(tmp_path, {}, {"pools": {"host": {"kv": "1MB", "state": "1MB"}}})
    hashes = page_hashes(list(range(2 * PAGE)))
    results = []
    for b in (theirs, ours):
        kv, mamba = pools()
        register(b, kv, mamba)
        b.register_mem_host_pool_v2(kv, PoolName.SWA)  # type: ignore[arg-type]
        swa = PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(2 * PAGE),
                           keys=hashes, hit_policy=PoolHitPolicy.TRAILING_PAGES)
        results.append(_normal(b.batch_set_v2([swa, kv_transfer(hashes, 0)])))
    assert results == [{"swa": [True, True], "kv": [True, True]},
                       {"swa": [False, False], "kv": [True, True]}]
    ours.close()
