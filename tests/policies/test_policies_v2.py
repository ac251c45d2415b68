"""Policies v2 switches: the product score ages dead nodes out, pooled budgets let a dead
intermediate checkpoint compete with leaves, Marconi's admission applied to anchors."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies.eviction.marconi import MarconiEviction, product_utility, utility
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.tiers.size_only import Budget

RNG = np.random.default_rng(7)


def _toks(n: int) -> np.ndarray:
    return RNG.integers(3, 32000, size=n, dtype=np.int64)


def test_product_score_lets_age_beat_efficiency_where_the_sum_never_does() -> None:
    # an old node of top efficiency (e = 1) against a fresh one of the lowest (e = 0)
    old_r, fresh_r, alpha = 1 / 1000, 1 / 2, 8.0
    # sum: normalised recency 0 + alpha vs 1 + 0: the old node stays (it is never the minimum)
    assert utility(old_r, 1.0, old_r, fresh_r, 0.0, 1.0, alpha) > utility(fresh_r, 0.0, old_r, fresh_r, 0.0, 1.0, alpha)
    # product: efficiency buys at most a factor 1 + alpha of age
    assert product_utility(old_r, 1.0, 0.0, 1.0, alpha) < product_utility(fresh_r, 0.0, 0.0, 1.0, alpha)
    assert product_utility(1 / 5, 1.0, 0.0, 1.0, alpha) > product_utility(fresh_r, 0.0, 0.0, 1.0, alpha)
    assert product_utility(0.3, 2.0, 2.0, 2.0, alpha) == pytest.approx(0.3)  # constant e: recency alone
    with pytest.raises(ValueError, match="score"):
        MarconiEviction(alpha=1.0, score="max")


def _dead_checkpoint_sim(geo, sim_config, joint: bool) -> tuple[Simulator, MarconiEviction]:
    pol = MarconiEviction(alpha=0.0, joint_pool=joint)
    sim = Simulator(sim_config, geo, Budget.pooled(10**15), eviction=pol)
    base, out = _toks(2048), _toks(8)
    sim.step(base, out)  # its final checkpoint at 2056 ...
    sim.step(np.concatenate([base, out, _toks(512)]), _toks(8))
    for _ in range(3):  # ... is now inside a single chain: a dead intermediate checkpoint, oldest
        sim.step(_toks(600), _toks(8))
    return sim, pol


def test_pooled_budget_lets_a_dead_intermediate_checkpoint_go_before_a_newer_leaf(geo, sim_config) -> None:
    for joint, first in ((False, ObjectKind.KV), (True, ObjectKind.STATE)):
        sim, pol = _dead_checkpoint_sim(geo, sim_config, joint)
        with sim:
            order = pol.victim_kinds((ObjectKind.KV, ObjectKind.STATE))
            assert order[0] is first, (joint, order)
            victim = pol.next_victim(ObjectKind.STATE)
            assert victim is not None and victim.children  # the intermediate one
    # one kind alone, or kinds in their own budgets: the order is left as given
    assert pol.victim_kinds((ObjectKind.KV,)) == (ObjectKind.KV,)
    assert pol.victim_kinds((ObjectKind.ANCHOR,)) == (ObjectKind.ANCHOR,)


@pytest.mark.parametrize("mode", ["all", "shared"])
def test_anchor_admission_shared_saves_pages_only_inside_tokens_seen_before(geo, mode) -> None:
    cfg = load_config(None, {"chunk_size": 256, "hash_block_size": 256, "alignment": 1,
                             "anchor_admission": mode}, environ={})
    budget = Budget.pooled(10**15, anchor=10**15)
    with Simulator(cfg, geo, budget, anchors=True) as sim:
        first = _toks(2048)
        sim.step(first, _toks(8))
        after_first = sim.store.put_bytes[ObjectKind.ANCHOR]
        # a request sharing the first 1024 tokens diverges there: no state at 1024, so the
        # shared part is computed again and its pages are now anchors of a shared prefix
        sim.step(np.concatenate([first[:1024], _toks(1024)]), _toks(8))
        after_second = sim.store.put_bytes[ObjectKind.ANCHOR]
        page = sim.anchor_bytes
    if mode == "all":
        assert after_first > 0 and after_second > after_first
    else:
        assert after_first == 0  # nothing was shared yet: a prefix seen once gets no anchors
        assert after_second - after_first == (1024 // cfg.anchor_page_size) * page


def test_tree_placement_keeps_one_branch_depths_off_another_branch() -> None:
    from hybrid_connector.policies.admission.placement_hook import DepthHistogram
    from hybrid_connector.policies.admission.placement_tree import TreeDepths, bin_chain

    trunk = _toks(1024)
    a = np.concatenate([trunk, _toks(1024)])
    b = np.concatenate([trunk, _toks(1024)])
    tree, flat = TreeDepths(64, 1.0), DepthHistogram(64, 1.0, replan_every=1)
    for _ in range(10):
        tree.observe(1800, bin_chain(b, 64))  # B's traffic stops deep in B
        flat.observe(1800)
        tree.observe(1216, bin_chain(a, 64))  # A's a little past the trunk
        flat.observe(1216)
    on_a = tree.plan(32, 2, bin_chain(a, 64))
    assert 1800 // 64 in flat.plan(32, 2)  # one prefix: a checkpoint at B's depth on A's path
    assert sorted(on_a) == [1024 // 64, 1216 // 64]  # the tree: trunk end (serves B) and A's own
    assert 1800 // 64 in tree.plan(32, 2, bin_chain(b, 64))
    with pytest.raises(ValueError):
        TreeDepths(0, 1.0)
