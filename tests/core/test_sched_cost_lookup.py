"""The vLLM scheduler side's cheaper index queries decide what the full ones decide.

* ``CacheIndex.lookup(..., floor=f)`` (``SchedulerSide.match`` passes vLLM's local hit): the
  plan of the full lookup whenever that one reaches past ``f``; otherwise a miss whose
  ``matched_tokens`` is the full lookup's and no more than ``f`` (the caller then answers
  "no hit", as it did for the full plan).
* ``CacheIndex.state_positions``: ``plan_saves``' state positions, admission asked
  the same way (a placement hook learns from each query: two indexes, one asked each way,
  stay in step).
"""

from __future__ import annotations

import numpy as np
import pytest
from cache_support import ALIGN, make_cache, save_seq


def _fill(cache, rng: np.random.Generator, trunks: list[np.ndarray], n: int) -> None:
    for _ in range(n):
        trunk = trunks[int(rng.integers(len(trunks)))]
        cut = int(rng.integers(0, trunk.size + 1))
        toks = np.concatenate([trunk[:cut], rng.integers(0, 5, int(rng.integers(4, 80)))])
        states = sorted({int(q) for q in rng.integers(1, toks.size + 1, 3)})
        save_seq(cache, toks.astype(np.int64), states)


def _query(rng: np.random.Generator, trunks: list[np.ndarray]) -> np.ndarray:
    trunk = trunks[int(rng.integers(len(trunks)))]
    cut = int(rng.integers(0, trunk.size + 1))
    return np.concatenate([trunk[:cut], rng.integers(0, 5, int(rng.integers(1, 40)))]).astype(
        np.int64)


@pytest.mark.parametrize("seed", range(5))
def test_lookup_with_a_floor_decides_as_the_full_lookup(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cache = make_cache(kv=3000, state=400, eviction="lru")
    trunks = [rng.integers(0, 5, int(rng.integers(20, 120))).astype(np.int64) for _ in range(3)]
    _fill(cache, rng, trunks, 30)
    ix = cache.index
    cut = passed = 0
    for _ in range(300):
        q = _query(rng, trunks)
        for align in (1, ALIGN):
            full = ix.lookup(q, alignment=align, replay=False)
            floor = int(rng.integers(0, q.size + 1))
            got = ix.lookup(q, alignment=align, replay=False, floor=floor)
            assert got.matched_tokens == full.matched_tokens
            if full.matched_tokens > floor:
                assert got == full
                passed += full.num_tokens > floor
            else:
                assert not got.hit and full.num_tokens <= floor
                cut += 1
    assert cut and passed  # both branches ran


@pytest.mark.parametrize("seed", range(4))
def test_state_positions_are_plan_saves_positions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # a placement hook learns from every query: both indexes must be asked alike
    caches = [make_cache(kv=3000, state=400, eviction="lru", placement_slots=4,
                         placement_bin=8) for _ in range(2)]
    trunks = [rng.integers(0, 5, int(rng.integers(40, 160))).astype(np.int64) for _ in range(3)]
    seeds = rng.integers(0, 2**31, 2)
    for c in caches:
        _fill(c, np.random.default_rng(int(seeds[0])), trunks, 20)
    qrng = np.random.default_rng(int(seeds[1]))
    nonempty = 0
    for _ in range(200):
        q = _query(qrng, trunks)
        align = int(qrng.choice([1, ALIGN]))
        want = set(caches[0].index.plan_saves(q, alignment=align).state_positions)
        assert caches[1].index.state_positions(q, alignment=align) == want
        nonempty += bool(want)
    assert nonempty
