"""Two cache instances in two processes share one remote store (a real ``redis-server``, a
real ``lmcache_server``): the second finds the first's objects through the store's
manifests and keys, hits on its prefixes, and loads exactly the bytes the first made; and
with the transformers runtime, its logits and restored states equal a full prefill's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cross_peer import GEO, config, prompts, serve

from hybrid_connector import assemble
from hybrid_connector.core.config import load_config

HERE = Path(__file__).resolve().parent


def run_peer(url: str, tmp: Path) -> None:
    """The first instance, in its own process."""
    out = tmp / "peer.done"
    env_path = f"{HERE}:{HERE.parent.parent}"
    subprocess.run([sys.executable, str(HERE / "cross_peer.py"), url, str(out)], check=True,
                   timeout=120, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert out.read_text() == "done"


@pytest.mark.parametrize("server", ["redis_server", "lmcache_server"])
def test_second_instance_hits_on_the_first_ones_prefixes(server: str, request, tmp_path: Path) -> None:
    url = request.getfixturevalue(server)
    run_peer(url, tmp_path)
    cache = assemble.cache(config(url), GEO)      # a fresh index: knows nothing yet
    assert not cache.index.where
    first, second = prompts()
    hit = serve(cache, np.r_[first, [1, 2, 3]])   # checked byte for byte inside
    assert hit >= 40 and cache.stats.hits == 1
    plan = cache.lookup(np.r_[first, [1, 2, 3]])
    assert {o.tier for o in plan.objects} <= {"host", "remote"}
    # the other branch the first instance saved: found too
    assert serve(cache, np.r_[second, [5]]) > 0
    cache.check_integrity()
    cache.close()


def test_no_shared_tier_means_no_discovery() -> None:
    cfg = load_config(overrides={"chunk_size": 8, "hash_block_size": 4, "alignment": 4}, environ={})
    cache = assemble.cache(cfg, GEO)
    assert cache.discover(prompts()[0]).kv_tokens == 0
    cache.close()


@pytest.mark.parametrize("chunk", [256, 4096])
def test_the_record_announcing_a_chunk_fits_the_remote_tiers_manifests(redis_server: str, chunk: int) -> None:
    """A chunk's record (its key, tokens and block hashes) must never be refused as too
    long: a chunk left unannounced can never be found by another instance. A tier made with
    the default limits holds a default chunk's record; one made from a config, its own."""
    from hybrid_connector.core.keys import ObjectKey, ObjectKind
    from hybrid_connector.core.meta import ObjectMeta
    from hybrid_connector.index.manifests import decode_record, encode_record
    from hybrid_connector.tiers.manager import TieredStore
    from hybrid_connector.tiers.remote.tier import RemoteTier

    cfg = load_config(overrides={"chunk_size": chunk, "remote_url": redis_server,
                                 "pools": {"remote": {"kv": 2**30}}}, environ={})
    # token ids of a 151k vocabulary (Qwen's) take 4 bytes each
    meta = ObjectMeta(prev=bytes(16), tokens=tuple(range(150_000, 150_000 + chunk)), block_size=16,
                      hashes=tuple(bytes([i % 256]) * 16 for i in range(chunk // 16)))
    key = ObjectKey("f" * 32, meta.hashes[-1], ObjectKind.KV, 0, chunk)
    record = encode_record(key, 4096, meta)
    tiers = [TieredStore.from_config(cfg).tiers[-1]]
    if chunk == 256:
        tiers.append(RemoteTier(redis_server, {ObjectKind.KV: 2**20}, timeout=5))
    for i, tier in enumerate(tiers):
        name = f"{'a' * 32}.{chunk + i:032x}"
        assert tier.append_record(name, record) is True
        assert [decode_record(r) for r in tier.records(name)] == [(key, 4096, meta)]
