"""Failure paths: whatever goes wrong below the backend, SGLang sees misses (``False``
pages, a zero hit), never an exception, and never wrong bytes reported as a hit."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageFailureInjector,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang_helpers import (  # noqa: E402
    PAGE,
    dynamic_backend,
    kv_bytes,
    kv_transfer,
    page_hashes,
    pools,
    register,
    slot_bytes,
    state_transfer,
    tier_overrides,
)
from tier_servers import run_redis  # noqa: E402


def _stored(tier: str, tmp_path: Path, redis: str = "") -> tuple:
    backend = dynamic_backend(tier_overrides(tier, tmp_path, lambda: redis))
    kv, mamba = pools()
    register(backend, kv, mamba)
    hashes = page_hashes(list(range(3 * PAGE)))
    assert backend.batch_set_v2([kv_transfer(hashes, 0), state_transfer(hashes[-1], 0)]) \
        == {"kv": [True] * 3, "mamba": [True]}
    return backend, kv, mamba, hashes


def test_sglang_failure_injector_turns_every_call_into_a_miss(tmp_path: Path) -> None:
    backend, kv, mamba, hashes = _stored("host", tmp_path)
    always = HiCacheStorageFailureInjector(backend, 0.0, 1.0)
    assert always.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)]).kv_hit_pages == 0
    assert always.batch_get_v2([kv_transfer(hashes, 10)]) == {"kv": [False] * 3}
    assert always.batch_set_v2([kv_transfer(hashes, 0)]) == {"kv": [False] * 3}
    assert always.exists(hashes[0]) is False and always.batch_exists(hashes) == 0
    backend.close()


def test_half_failing_calls_are_either_misses_or_the_true_answer(tmp_path: Path) -> None:
    backend, kv, mamba, hashes = _stored("host", tmp_path)
    flaky = HiCacheStorageFailureInjector(backend, 0.0, 0.5)
    for i in range(40):
        hit = flaky.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)])
        assert hit.kv_hit_pages in (0, 3)
        slot = 1 + i % 7
        mamba.temporal_buffer[slot].zero_()
        got = flaky.batch_get_v2([kv_transfer(hashes, 10), state_transfer(hashes[-1], slot)])
        assert got in ({"kv": [True] * 3, "mamba": [True]}, {"kv": [False] * 3, "mamba": [False]})
        if got["mamba"][0]:
            assert slot_bytes(mamba, slot) == slot_bytes(mamba, 0)
            assert kv_bytes(kv, 10, 3) == kv_bytes(kv, 0, 3)
    backend.close()


def test_sglangs_env_switch_wraps_our_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "1.0")
    wrapped = dynamic_backend(tier_overrides("host", tmp_path, lambda: ""))
    assert isinstance(wrapped, HiCacheStorageFailureInjector)
    assert wrapped.batch_exists_v2(page_hashes(list(range(PAGE)))).kv_hit_pages == 0
    wrapped.close()


def test_a_remote_tier_that_goes_away_gives_misses(tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    with run_redis(tmp_path / "redis") as url:
        backend, kv, mamba, hashes = _stored("remote", tmp_path, url)
        assert backend.batch_exists_v2(hashes).kv_hit_pages == 3
    # The server is gone: reads miss, writes fail, nothing raises.
    got = backend.batch_get_v2([kv_transfer(hashes, 10), state_transfer(hashes[-1], 3)])
    assert got == {"kv": [False] * 3, "mamba": [False]}
    more = page_hashes(list(range(50, 50 + 2 * PAGE)))
    assert backend.batch_set_v2([kv_transfer(more, 4)]) == {"kv": [False, False]}
    assert backend.batch_exists_v2(more).kv_hit_pages == 0
    backend.close()


def test_corrupt_nvme_files_are_misses(tmp_path: Path) -> None:
    backend, kv, mamba, hashes = _stored("nvme", tmp_path)
    files = [p for p in (tmp_path / "nvme").rglob("*") if p.is_file() and p.stat().st_size > 256]
    assert files
    for p in files:
        raw = bytearray(p.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        p.write_bytes(bytes(raw))
    before = kv_bytes(kv, 10, 3)
    got = backend.batch_get_v2([kv_transfer(hashes, 10), state_transfer(hashes[-1], 3)])
    assert got == {"kv": [False] * 3, "mamba": [False]}
    assert kv_bytes(kv, 10, 3) == before  # a failed read leaves the host slots alone
    backend.close()


def test_bad_requests_are_misses(tmp_path: Path) -> None:
    backend, kv, mamba, hashes = _stored("host", tmp_path)
    short = PoolTransfer(name=PoolName.KV, host_indices=torch.arange(PAGE), keys=hashes)
    assert backend.batch_get_v2([short]) == {"kv": [False] * 3}
    assert backend.batch_set_v2([PoolTransfer(name=PoolName.KV, keys=hashes)]) == {"kv": [False] * 3}
    nameless = PoolTransfer(name=PoolName.INDEXER, host_indices=torch.arange(3 * PAGE), keys=hashes)
    assert backend.batch_get_v2([nameless]) == {"indexer": [False] * 3}
    bad_keys = [hashes[0], None, "x" * 300]
    assert backend.batch_get_v2([kv_transfer(bad_keys, 10)]) == {"kv": [True, False, False]}  # type: ignore[arg-type]
    assert backend.batch_exists_v2(bad_keys).kv_hit_pages == 0  # type: ignore[arg-type]
    groups = PoolTransfer(name=PoolName.MAMBA, keys=hashes, hit_policy=PoolHitPolicy.BLOCK_GROUPS)
    assert backend.batch_exists_v2(hashes, [groups]).kv_hit_pages == 0
    assert backend.get(hashes[0], None) is None and backend.set("k", "not a tensor") is False
    # A page of another geometry (a differently shaped host pool) is a miss, not a reshape.
    other_kv, other_mamba = pools()
    other_kv.kv_buffer = torch.zeros(2, 64, 2, 4, 8, dtype=torch.bfloat16)
    register(backend, other_kv, other_mamba)
    assert backend.batch_get_v2([kv_transfer(hashes, 4)]) == {"kv": [False] * 3}
    backend.close()
