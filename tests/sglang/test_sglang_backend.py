"""The SGLang HiCache backend against SGLang 0.5.23's real storage module: built by
SGLang's ``dynamic`` factory, v2 round trips per pool bit-identical through each tier,
the ``batch_exists_v2`` answer SGLang's ``count_pool_hits`` then confirms, and the v1 and
legacy calls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    count_pool_hits,
)
from sglang_helpers import (  # noqa: E402
    PAGE,
    TIERS,
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

from hybrid_connector.integrations.sglang import HybridHiCacheStorage  # noqa: E402


@pytest.fixture
def make(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., HiCacheStorage]:
    made: list[HiCacheStorage] = []

    def build(tier: str, **kw: str) -> HiCacheStorage:
        redis = lambda: str(request.getfixturevalue("redis_server"))  # noqa: E731
        b = dynamic_backend(tier_overrides(tier, tmp_path / str(len(made)), redis, **kw))
        made.append(b)
        return b

    yield build
    for b in made:
        b.close()


def test_the_dynamic_factory_builds_our_backend(make: Callable[..., HiCacheStorage]) -> None:
    assert isinstance(make("host"), HybridHiCacheStorage)


@pytest.mark.parametrize("tier", TIERS)
def test_v2_round_trip_per_pool_is_bit_identical(tier: str, make: Callable[..., HiCacheStorage]) -> None:
    backend = make(tier)
    kv, mamba = pools()
    register(backend, kv, mamba)
    hashes = page_hashes(list(range(100, 100 + 6 * PAGE)))
    done = backend.batch_set_v2([kv_transfer(hashes, 0), state_transfer(hashes[-1], 2)])
    assert done == {"kv": [True] * 6, "mamba": [True]}
    hit = backend.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (6, [6])
    # Load into other host slots, as a prefetch does; the bytes are the ones stored.
    got = backend.batch_get_v2([kv_transfer(hashes, 20), state_transfer(hashes[-1], 6)])
    assert got == {"kv": [True] * 6, "mamba": [True]}
    assert kv_bytes(kv, 20, 6) == kv_bytes(kv, 0, 6)
    assert slot_bytes(mamba, 6) == slot_bytes(mamba, 2)
    assert count_pool_hits(got) == {"kv": 6, "mamba": 1}


@pytest.mark.parametrize("tier", TIERS)
def test_clear_forgets_this_ranks_pages(
        tier: str, make: Callable[..., HiCacheStorage]) -> None:
    backend = make(tier)
    kv, mamba = pools()
    register(backend, kv, mamba)
    hashes = page_hashes(list(range(2 * PAGE)))
    backend.batch_set_v2([kv_transfer(hashes, 0)])
    assert backend.batch_exists_v2(hashes).kv_hit_pages == 2
    backend.clear()
    # The shared (remote) tier keeps its copies for other instances: found again there.
    assert backend.batch_exists_v2(hashes).kv_hit_pages == (2 if tier == "remote" else 0)


def _save_request(backend: HiCacheStorage, hashes: list[str], first_page: int, slot: int) -> None:
    """What SGLang's hybrid controller writes for a request: KV pages plus the state at
    the last page (one MAMBA slot)."""
    res = backend.batch_set_v2([state_transfer(hashes[-1], slot), kv_transfer(hashes, first_page)])
    assert count_pool_hits(res) == {"kv": len(hashes), "mamba": 1}


def test_exists_v2_gives_the_prefix_count_pool_hits_then_confirms(
        make: Callable[..., HiCacheStorage]) -> None:
    """Two turns of one conversation (states at pages 2 and 4), queried with a longer
    prompt: the KV hit is 4 pages, restorable at 2 and 4; SGLang's controller re-aims the
    trailing MAMBA key at the hit and loads: ``count_pool_hits`` equals the prefix."""
    backend = make("host")
    kv, mamba = pools()
    register(backend, kv, mamba)
    tokens = list(range(7, 7 + 6 * PAGE))
    hashes = page_hashes(tokens)
    _save_request(backend, hashes[:2], 0, 0)
    _save_request(backend, hashes[:4], 0, 1)
    hit = backend.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)])
    assert hit.kv_hit_pages == 4 and hit.restorable_prefix_pages == [2, 4]
    assert hit.extra_pool_hit_pages == {"kv": 4, "mamba": 4}
    n = hit.kv_hit_pages
    got = backend.batch_get_v2([kv_transfer(hashes[:n], 10), state_transfer(hashes[n - 1], 5)])
    assert count_pool_hits(got) == {"kv": n, "mamba": 1}
    assert slot_bytes(mamba, 5) == slot_bytes(mamba, 1)
    # Without the state at page 4 the usable prefix falls back to the state at page 2.
    sid = backend.keys.key("mamba", hashes[3])  # type: ignore[attr-defined]
    backend.store.remove([sid])  # type: ignore[attr-defined]
    hit = backend.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (2, [2])


def test_all_pages_policy_needs_every_page(make: Callable[..., HiCacheStorage]) -> None:
    backend = make("host")
    kv, mamba = pools()
    register(backend, kv, mamba)
    hashes = page_hashes(list(range(3 * PAGE)))
    backend.batch_set_v2([kv_transfer(hashes, 0), state_transfer(hashes[0], 0)])
    allp = PoolTransfer(name=PoolName.MAMBA, keys=hashes, hit_policy=PoolHitPolicy.ALL_PAGES)
    assert backend.batch_exists_v2(hashes, [allp]).kv_hit_pages == 1


def test_unsupported_pools_are_misses_not_errors(make: Callable[..., HiCacheStorage]) -> None:
    backend = make("host")
    kv, mamba = pools()
    register(backend, kv, mamba)
    hashes = page_hashes(list(range(2 * PAGE)))
    backend.batch_set_v2([kv_transfer(hashes, 0)])
    swa = PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(2 * PAGE), keys=hashes,
                       hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert backend.batch_set_v2([swa]) == {"swa": [False, False]}
    assert backend.batch_exists_v2(hashes, [swa]).kv_hit_pages == 0


def test_v1_and_legacy_calls(make: Callable[..., HiCacheStorage]) -> None:
    backend = make("host")
    kv, mamba = pools()
    register(backend, kv, mamba)
    hashes = page_hashes(list(range(3 * PAGE)))
    idx = torch.arange(0, 3 * PAGE)
    assert backend.batch_set_v1(hashes, idx) == [True] * 3
    assert backend.batch_exists(hashes) == 3 and backend.exists(hashes[0])
    assert backend.batch_get_v1(hashes, torch.arange(8 * PAGE, 11 * PAGE)) == [True] * 3
    assert kv_bytes(kv, 8, 3) == kv_bytes(kv, 0, 3)
    value = kv.get_data_page(4 * PAGE)  # as SGLang's legacy page set passes it: a flat page
    assert backend.set("legacy-key", value) and backend.exists("legacy-key")
    out = kv.get_dummy_flat_data_page()
    assert backend.get("legacy-key", out) is out and torch.equal(out, value)
    assert backend.get("other-key", kv.get_dummy_flat_data_page()) is None
    assert backend.batch_set(["a", "b"], [value, value]) is True
    outs = [kv.get_dummy_flat_data_page() for _ in range(2)]
    assert [t is not None for t in backend.batch_get(["a", "zz"], outs)] == [True, False]


def test_bad_configuration_is_refused_at_start_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overrides must be a mapping"):
        dynamic_backend("not a mapping")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pools"):
        dynamic_backend({"pools": {"host": {"kv": "lots"}}})


def test_a_full_host_pool_demotes_to_nvme_and_pages_still_load_bit_identical(tmp_path: Path) -> None:
    """Host pools of 8 KV pages and 2 states over NVMe: older requests move down a tier
    (states by their own pool's order) and still hit, byte for byte."""
    backend = dynamic_backend({
        "pools": {"host": {"kv": 8 * 512, "state": 2 * 640},
                  "disk": {"kv": "1MB", "state": "1MB"}},
        "local_disk": str(tmp_path / "nvme"), "max_local_disk_size": "4MB", "disk_fsync": False})
    kv, mamba = pools()
    register(backend, kv, mamba)
    reqs = [page_hashes(list(range(1000 * r, 1000 * r + 4 * PAGE))) for r in range(3)]
    for r, hs in enumerate(reqs):
        _save_request(backend, hs, 4 * r, r)
    store = backend.store  # type: ignore[attr-defined]
    where = [store.where([backend.keys.key("mamba", hs[-1])])[0] for hs in reqs]  # type: ignore[attr-defined]
    assert where == ["nvme", "host", "host"]
    assert store.where([backend.keys.key("kv", reqs[0][0])]) == ["nvme"]  # type: ignore[attr-defined]
    for r, hs in enumerate(reqs):
        hit = backend.batch_exists_v2(hs, [state_transfer(hs[-1], None)])
        assert hit.kv_hit_pages == 4
        got = backend.batch_get_v2([kv_transfer(hs, 16), state_transfer(hs[-1], 7)])
        assert count_pool_hits(got) == {"kv": 4, "mamba": 1}
        assert kv_bytes(kv, 16, 4) == kv_bytes(kv, 4 * r, 4)
        assert slot_bytes(mamba, 7) == slot_bytes(mamba, r)
    backend.close()


def test_a_state_goes_when_the_kv_page_it_ends_on_is_dropped(make: Callable[..., HiCacheStorage]) -> None:
    """KV pool of 4 pages, state pool of 4 states: the second request pushes the first's
    KV out of the only tier; the first's state, which needs that KV, is dropped with it."""
    backend = make("host", kv=str(4 * 512), state=str(4 * 640))
    kv, mamba = pools()
    register(backend, kv, mamba)
    a = page_hashes(list(range(4 * PAGE)))
    b = page_hashes(list(range(500, 500 + 4 * PAGE)))
    _save_request(backend, a, 0, 0)
    _save_request(backend, b, 4, 1)
    where = backend.store.where  # type: ignore[attr-defined]
    key = backend.keys.key  # type: ignore[attr-defined]
    assert where([key("kv", h) for h in a]) == [None] * 4
    assert where([key("mamba", a[-1]), key("mamba", b[-1])]) == [None, "host"]
    assert backend.batch_exists_v2(b, [state_transfer(b[-1], None)]).kv_hit_pages == 4


def test_a_restarted_backend_finds_its_nvme_pages(tmp_path: Path) -> None:
    """SGLang restarts: a new backend over the same NVMe directory hits on what the old
    one stored, bytes included (the tier re-reads its objects at start)."""
    over = tier_overrides("nvme", tmp_path, lambda: "")
    first = dynamic_backend(over)
    kv, mamba = pools()
    register(first, kv, mamba)
    hashes = page_hashes(list(range(3 * PAGE)))
    _save_request(first, hashes, 0, 0)
    first.close()
    again = dynamic_backend(over)
    kv2, mamba2 = pools(seed=5)
    register(again, kv2, mamba2)
    assert again.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)]).kv_hit_pages == 3
    got = again.batch_get_v2([kv_transfer(hashes, 8), state_transfer(hashes[-1], 4)])
    assert count_pool_hits(got) == {"kv": 3, "mamba": 1}
    assert kv_bytes(kv2, 8, 3) == kv_bytes(kv, 0, 3) and slot_bytes(mamba2, 4) == slot_bytes(mamba, 0)
    again.close()


def test_tp_ranks_keep_their_own_shards(tmp_path: Path, redis_server: str) -> None:
    """Two TP ranks: one NVMe directory each under ``local_disk``; on a shared remote tier
    neither sees the other's KV or state shard (their bytes differ)."""
    over = {"pools": {"disk": {"kv": "1MB", "state": "1MB"}, "remote": {"kv": "1MB", "state": "1MB"}},
            "local_cpu": False, "local_disk": str(tmp_path / "nvme"), "max_local_disk_size": "4MB",
            "disk_fsync": False, "remote_url": redis_server}
    ranks = [dynamic_backend(over, tp_rank=r, tp_size=2, model="tp-test") for r in (0, 1)]
    for r, b in enumerate(ranks):
        register(b, *pools(seed=r))
    hashes = page_hashes(list(range(77, 77 + 2 * PAGE)))
    _save_request(ranks[0], hashes, 0, 0)
    assert ranks[0].batch_exists_v2(hashes).kv_hit_pages == 2
    assert ranks[1].batch_exists_v2(hashes).kv_hit_pages == 0
    assert sorted(p.name for p in (tmp_path / "nvme").iterdir()) == [
        "tp0_2_pp0_1_cp0_1_dp0", "tp1_2_pp0_1_cp0_1_dp0"]
    for b in ranks:
        b.close()


def test_another_instance_finds_pages_on_the_shared_remote_tier(tmp_path: Path, redis_server: str) -> None:
    """Two SGLang instances of one model (separate stores) share a real redis tier: the
    second hits on what the first stored, bytes included; another rank's shard does not."""
    over = {"local_cpu": False, "remote_url": redis_server,
            "pools": {"remote": {"kv": "1MB", "state": "1MB"}}}
    writer, reader = dynamic_backend(over, model="shared"), dynamic_backend(over, model="shared")
    other_rank = dynamic_backend(over, model="shared", tp_rank=1, tp_size=2)
    kv, mamba = pools()
    register(writer, kv, mamba)
    kv2, mamba2 = pools(seed=9)
    register(reader, kv2, mamba2)
    register(other_rank, *pools(seed=3))
    hashes = page_hashes(list(range(333, 333 + 3 * PAGE)))
    _save_request(writer, hashes, 0, 0)
    hit = reader.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)])
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (3, [3])
    got = reader.batch_get_v2([kv_transfer(hashes, 8), state_transfer(hashes[-1], 4)])
    assert count_pool_hits(got) == {"kv": 3, "mamba": 1}
    assert kv_bytes(kv2, 8, 3) == kv_bytes(kv, 0, 3) and slot_bytes(mamba2, 4) == slot_bytes(mamba, 0)
    assert other_rank.batch_exists_v2(hashes).kv_hit_pages == 0
    for b in (writer, reader, other_rank):
        b.close()
