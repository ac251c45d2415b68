"""An engine-style driver under tight budgets: requests that diverge at, one before and one
after chunk boundaries and checkpoints, KV chunks cut at checkpoints, the life of a request
as a paged engine runs it. After every request: no spurious rejection (every item the
engine offers is stored or already present) and no orphaned store bytes (store bytes ==
index bytes, per kind), with evictions and hits both happening."""

from __future__ import annotations

import numpy as np
import pytest
from cache_support import CHUNK, SAVED, TINY, config, kv_items, made_for, state_item

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.tiers.device import DeviceTier
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.memory import MemoryStore

KVB = TINY.kv_bytes_per_token()
SB = TINY.state_bytes()


def requests(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Branches off one 64-token prefix at c-1, c, c+1 for every chunk boundary c, each
    asked twice (the second time it should hit), interleaved with unrelated prompts."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 50, 64)
    out = []
    for c in range(CHUNK, 64, CHUNK):
        for d in (c - 1, c, c + 1):
            prompt = np.r_[base[:d], rng.integers(100, 150, int(rng.integers(6, 30)))]
            for _ in range(2):
                out.append((prompt, rng.integers(200, 250, int(rng.integers(1, 9)))))
            out.append((rng.integers(300, 350, int(rng.integers(10, 40))), rng.integers(0, 9, 3)))
    return out


def run(cache: HybridCache, reqs) -> dict[str, int]:
    """One request at a time, as a paged engine does it; returns counters."""
    seen = {"hit_tokens": 0, "rejected": 0}
    for prompt, output in reqs:
        n = len(prompt)
        plan = cache.lookup(prompt)
        lease = cache.acquire(plan)
        p = 0
        if lease is not None:
            res = cache.load(plan)
            assert not res.failed and res.num_tokens == plan.num_tokens
            for obj, t in zip(plan.kv, res.kv, strict=True):
                assert made_for(t, prompt, min(obj.ref.end, plan.kv_tokens))
            assert SAVED[res.state.numpy().tobytes()] == tuple(int(x) for x in prompt[:res.num_tokens])
            p = res.num_tokens
        sp = cache.plan_saves(prompt)
        states = [q for q in sp.state_positions if p < q < n]
        # prefill: full chunks from kv_from, also cut at every checkpoint
        kv_upto = n - n % CHUNK
        items = kv_items(prompt, sp.kv_from, max(kv_upto, sp.kv_from), cuts=states)
        items += [state_item(prompt, q) for q in states]
        r = cache.save(prompt, items)
        cache.release(lease)
        full = np.r_[prompt, output]
        m = len(full)
        final = cache.final_checkpoint(m)
        start = max(kv_upto, sp.kv_from)
        tail = kv_items(full, start, m, cuts=[final]) if start < m else []
        f = cache.finish(full, tail + ([state_item(full, final)] if final else []), prompt_len=n)
        seen["hit_tokens"] += p
        seen["rejected"] += r.rejected + f.rejected
        assert r.rejected == 0 and f.rejected == 0, (r.rejections, f.rejections)
        cache.check_integrity()
        for k in ObjectKind:
            assert cache.store.used(k) == cache.tree.bytes[k], f"orphaned {k.value} bytes"
    return seen


@pytest.mark.parametrize("tiered", [False, True])
def test_engine_driver_has_no_spurious_rejections_and_no_orphans(tiered: bool) -> None:
    kv, st = 12 * CHUNK * KVB, 6 * SB
    if tiered:  # slab tiers take whole 64-byte units per object: budget in those
        half = {ObjectKind.KV: kv // 2, ObjectKind.STATE: 3 * 64}
        store = TieredStore([DeviceTier(half, device="cpu"), HostTier(half)])
    else:
        store = MemoryStore({ObjectKind.KV: kv, ObjectKind.STATE: st})
    cache = assemble.cache(config(), TINY, store)
    seen = run(cache, requests())
    assert seen["rejected"] == 0
    assert seen["hit_tokens"] > 0
    assert sum(cache.stats.evicted.values()) > 0      # the budgets really were tight
    cache.close()
