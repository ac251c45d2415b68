"""Interop with LMCache 0.5.6 both ways, on 127.0.0.1: LMCache's own ``lm://`` connector
class (``LMCServerConnector``, with its ``LocalCPUBackend`` allocator and ``MemoryObj``)
stores and reads through our server; our remote tier stores and reads through our server
and through a real ``lmcache_server``."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from server_support import served, server_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiers"))
from tier_helpers import DTYPES, make_key, make_payload, same_bits  # noqa: E402

from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.tiers.host import HostTier  # noqa: E402
from hybrid_connector.tiers.manager import TieredStore  # noqa: E402
from hybrid_connector.tiers.remote.tier import RemoteTier  # noqa: E402

K = ObjectKind


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``lm://`` URL of our server (host + NVMe tiers)."""
    with served(server_config(tmp_path_factory.mktemp("srv"), host_mb=8, disk_mb=256)) as s:
        yield f"lm://127.0.0.1:{s.port}"


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(5)


def test_lmcache_connector_stores_and_reads_through_our_server(
        ours: str, loop: asyncio.AbstractEventLoop) -> None:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector.lm_connector import LMCServerConnector
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    cfg = LMCacheEngineConfig.from_defaults(chunk_size=256, local_cpu=True, max_local_cpu_size=0.1)
    meta = LMCacheMetadata(model_name="tiny-model", world_size=1, local_world_size=1,
                           worker_id=0, local_worker_id=0, kv_dtype=torch.bfloat16,
                           kv_shape=(4, 2, 256, 4, 64), chunk_size=256)
    backend = LocalCPUBackend(cfg, metadata=meta, memory_allocator=MixedMemoryAllocator(64 << 20))
    host, port = ours.removeprefix("lm://").split(":")
    conn = LMCServerConnector(host, int(port), loop, backend)

    def run(coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    objs = {}
    for i, (shape, dtype) in enumerate([((2, 4, 256, 64), torch.bfloat16),
                                        ((2, 2, 256, 128), torch.float16),
                                        ((2, 1, 16, 8), torch.float32)]):
        key = CacheEngineKey("tiny-model", 1, 0, 0xABC000 + i, dtype)
        obj = backend.allocate(torch.Size(shape), dtype, MemoryFormat.KV_2LTD)
        assert obj is not None
        data = make_payload(i, shape, dtype)
        obj.tensor.copy_(data)
        run(conn.put(key, obj))
        objs[key] = (data, shape, dtype)
    for key, (data, shape, dtype) in objs.items():
        assert conn.exists_sync(key)
        got = run(conn.get(key))
        assert got is not None
        assert got.get_shape() == torch.Size(shape) and got.get_dtype() == dtype
        assert got.get_memory_format() == MemoryFormat.KV_2LTD
        assert same_bits(got.tensor, data)
    missing = CacheEngineKey("tiny-model", 1, 0, 0xDEAD, torch.bfloat16)
    assert not conn.exists_sync(missing)
    assert run(conn.get(missing)) is None
    run(conn.close())


@pytest.mark.server
@pytest.mark.parametrize("which", ["ours", "lmcache_server"])
def test_our_remote_tier_round_trips_every_kind(which: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue(which))
    tier = RemoteTier(url, {k: 1 << 24 for k in K})
    items = [(make_key(500 + i, kind, fp=f"interop-{which[:4]}"), make_payload(i, shape, dt))
             for i, (kind, dt, shape) in enumerate(
                 (k, d, s) for k in K for d in DTYPES for s in [(3, 5), (64,)])]
    assert all(tier.put(items))
    for (k, v), got in zip(items, tier.get([k for k, _ in items]), strict=True):
        assert same_bits(got, v), (k, v.dtype)
    tier.close()
    # a host tier demoting into the remote one and promoting back, through TieredStore
    m = TieredStore([HostTier({K.KV: 1024}), RemoteTier(url, {K.KV: 1 << 20})])
    items = [(make_key(i, fp=f"mgr-{which[:4]}"), make_payload(i, (64,))) for i in range(10)]
    assert all(m.put(items))
    assert m.where([items[0][0]]) == ["remote"]
    for k, v in items:
        assert same_bits(m.get([k])[0], v)
    m.close()


def test_our_remote_tier_objects_land_in_the_server_pools_of_their_kind(tmp_path: Path) -> None:
    """The object kind rides in the key's model field (a plain LMCache server ignores it:
    the lmcache_server case above reads them back): our server stores each kind in its own
    per-kind pool, so a flood of KV never evicts states kept for the same prefixes."""
    cfg = server_config(tmp_path, host_mb=0, pools={"host": {"kv": 64 << 10, "state": 1 << 20}},
                        local_cpu=True, max_local_cpu_size="2MiB")
    with served(cfg) as server:
        tier = RemoteTier(f"lm://127.0.0.1:{server.port}", {k: 1 << 24 for k in K})
        states = [(make_key(900 + i, K.STATE, fp="pools"), make_payload(i, (1024,))) for i in range(4)]
        kv = [(make_key(i, K.KV, fp="pools"), make_payload(i, (4096,))) for i in range(40)]
        assert all(tier.put(states)) and all(tier.put(kv))  # KV overflows its 64 KiB pool
        held = server.service.stats()["plain"]["held"]
        by_kind = {kind: n for model in held.values() for t in model.values()
                   for kind, (n, _) in t.items()}
        assert by_kind["state"] == 4 and 0 < by_kind["kv"] < 40
        got = tier.get([k for k, _ in states])
        assert all(same_bits(g, v) for g, (_, v) in zip(got, states, strict=True))
        tier.close()
