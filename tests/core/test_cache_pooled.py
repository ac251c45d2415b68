"""A cache over a host tier whose KV and states share one budget (``pools.host.kv_state``),
built by ``hybrid_connector.assemble`` from the config (real ``HostTier`` slab, ledger and
index): a KV-heavy phase then a state-heavy phase keep more hits than the same bytes split
in a fixed KV : state ratio, and the store never holds more than its budget."""

from __future__ import annotations

import numpy as np
import pytest
from cache_support import TINY, config, save_seq

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKind

BUDGET = 64 * 48  # 3 KiB: slab pages are 64 B (a chunk of 8 tokens: 2 pages, a state: 1)
SPLITS = {"shared": {"kv_state": f"{BUDGET}B"},
          "fixed": {"kv": f"{BUDGET * 3 // 5}B", "state": f"{BUDGET * 2 // 5}B"}}


def run(split: str, eviction: dict[str, object]) -> tuple[int, int]:
    """Hit tokens over each phase's prompts, asked right after that phase."""
    cfg = config(max_local_cpu_size=f"{BUDGET}B", pools={"host": {**SPLITS[split], "anchor": "0B"}},
                 **eviction)
    c = assemble.cache(cfg, TINY)
    try:
        kv_heavy = [np.arange(64) + 1000 * (i + 1) for i in range(6)]  # 8 chunks, 1 state each
        for seq in kv_heavy:
            save_seq(c, seq, states=[64])
        hits_kv = sum(c.lookup(np.r_[s, [7]]).num_tokens for s in kv_heavy)
        # states at every chunk of short prompts branching from one shared prefix
        stem = np.arange(16) + 99_000
        state_heavy = [np.r_[stem, np.arange(16) + 100_000 + 100 * i] for i in range(16)]
        for seq in state_heavy:
            save_seq(c, seq, states=[8, 16, 24, 32])
        hits_state = sum(c.lookup(np.r_[s, [7]]).num_tokens for s in state_heavy)
        c.flush()
        held = sum(c.store.used(k) for k in (ObjectKind.KV, ObjectKind.STATE))
        assert held <= BUDGET
        c.check_integrity()
        return hits_kv, hits_state
    finally:
        c.close()


@pytest.mark.parametrize("eviction", [{"eviction": "lru"},
                                      {"eviction": "marconi", "alpha": 0.0,
                                       "pooled_eviction": "utility"}],
                         ids=["lru", "marconi-utility"])
def test_shared_budget_keeps_more_than_a_fixed_split(eviction: dict[str, object]) -> None:
    shared, fixed = run("shared", eviction), run("fixed", eviction)
    assert shared[0] > fixed[0], (shared, fixed)  # KV-heavy: KV takes the states' room
    assert shared[1] >= fixed[1], (shared, fixed)  # state-heavy: states take KV's back
    assert sum(shared) > sum(fixed), (shared, fixed)
