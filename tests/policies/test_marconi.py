"""Marconi eviction: formulas, preferences, locks, and incremental == full walk."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector import assemble
from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies import build
from hybrid_connector.policies.eviction.accounting import ReferenceAccounting
from hybrid_connector.policies.eviction.lru import LRUEviction
from hybrid_connector.policies.eviction.marconi import MarconiEviction, recency, utility
from hybrid_connector.policies.eviction.marconi_fullwalk import FullWalkMarconi
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.sim.traces import agentic, multi_turn_chat, shared_document_qa
from hybrid_connector.tiers.size_only import Budget


def test_recency_and_utility_formulas() -> None:
    assert recency(10, 9) == 1.0
    assert recency(10, 10) == 1.0  # floor at one tick
    assert recency(10, 6) == 0.25
    assert utility(0.5, 3.0, 0.0, 1.0, 1.0, 5.0, 2.0) == pytest.approx(0.5 + 2.0 * 0.5)
    assert utility(0.5, 3.0, 0.5, 0.5, 3.0, 3.0, 2.0) == 0.0  # constant terms normalise to 0


class Checked(MarconiEviction):
    """Asserts on every eviction that the incremental index picks the full walk's node."""

    def bind(self, tree, geometry, evictable) -> None:
        super().bind(tree, geometry, evictable)
        self.ref = FullWalkMarconi(alpha=self.alpha, accounting=self._accounting_factory,
                                   score=self.score)
        self.ref.bind(tree, geometry, evictable)
        self.checked = 0

    def _choose(self, kind):
        got = super()._choose(kind)
        self.ref._now, self.ref.alpha = self._now, self.alpha
        want = FullWalkMarconi._choose(self.ref, kind)
        assert got is want, (kind, got, want)
        self.checked += 1
        return got


def _replay(sim: Simulator, records) -> None:
    for r in records:
        sim.step(np.asarray(r["input_tokens"]), np.asarray(r["output_tokens"]))
    sim.cache.check_integrity()


@pytest.mark.parametrize(
    ("alpha", "refresh_path", "reference", "pooled", "score"),
    [(0.0, True, False, True, "sum"), (0.7, False, False, True, "sum"), (2.0, False, True, True, "sum"),
     (1.3, False, False, False, "sum"), (4.0, False, False, True, "product"),
     (16.0, False, False, False, "product")],
)
def test_incremental_index_matches_full_walk(geo, sim_config, alpha, refresh_path, reference, pooled,
                                             score) -> None:
    from hybrid_connector.policies.eviction.accounting import CorrectedAccounting

    acct = ReferenceAccounting if reference else CorrectedAccounting
    pol = Checked(alpha=alpha, refresh_path=refresh_path, accounting=acct, score=score)
    if pooled:
        budget = Budget.pooled(int(3e9))
    else:
        budget = Budget.per_kind({ObjectKind.KV: int(0.8e9), ObjectKind.STATE: int(1.0e9)})
    sim = Simulator(sim_config, geo, budget, eviction=pol)
    recs = agentic(4, 14, 1, as_arrays=True) + shared_document_qa(3, 30, 2, doc_tokens=(2000, 6000), as_arrays=True)
    recs.sort(key=lambda r: r["ts"])
    _replay(sim, recs)
    assert pol.checked > 30
    assert sim.cache.stats.evicted["kv"] > 0


def test_full_walk_and_incremental_give_identical_runs(geo, sim_config) -> None:
    recs = multi_turn_chat(12, 6, 3, lengths="sharegpt", as_arrays=True)
    out = []
    for cls in (MarconiEviction, FullWalkMarconi):
        pol = cls(alpha=1.0)
        sim = Simulator(sim_config, geo, Budget.pooled(int(1.5e9)), eviction=pol)
        hits = [sim.step(r["input_tokens"], r["output_tokens"]).hit for r in recs]
        out.append((hits, dict(sim.cache.stats.evicted)))
    assert out[0] == out[1]
    assert out[0][1]["kv"] > 0


def _two_leaves(geo, sim_config, short: int, long: int):
    """Two unrelated sequences cached; returns (sim, policy, short leaf, long leaf)."""
    pol = MarconiEviction(alpha=0.0)
    sim = Simulator(sim_config, geo, Budget.pooled(int(1e12)), eviction=pol)
    rng = np.random.default_rng(0)
    a = rng.integers(3, 30000, size=short)
    b = rng.integers(3, 30000, size=long)
    sim.step(a, np.array([5]))
    sim.step(b, np.array([6]))
    tree = sim.cache.tree
    la = tree.match(np.append(a, 5)).node
    lb = tree.match(np.append(b, 6)).node
    return sim, pol, la, lb


def test_alpha_zero_is_lru_and_large_alpha_keeps_the_efficient_node(geo, sim_config) -> None:
    sim, pol, short_leaf, long_leaf = _two_leaves(geo, sim_config, 300, 20_000)
    # The long sequence was used last: LRU evicts the short one's leaf first.
    assert pol.next_victim(ObjectKind.KV) is short_leaf
    # Make the long one the older one: LRU would now take it ...
    pol.on_access([short_leaf], pol._now + 5)
    assert pol.next_victim(ObjectKind.KV) is long_leaf
    # ... but its FLOPs per byte are far higher (deep attention context), so with a large
    # alpha Marconi keeps it and evicts the short, recently used leaf.
    pol.alpha = 5.0
    assert pol.next_victim(ObjectKind.KV) is short_leaf


def test_locked_nodes_are_never_chosen(geo, sim_config) -> None:
    sim, pol, short_leaf, long_leaf = _two_leaves(geo, sim_config, 300, 2000)
    sim.cache.tree.lock_kv(short_leaf)
    assert pol.next_victim(ObjectKind.KV) is long_leaf
    sim.cache.tree.lock_kv(long_leaf)
    assert pol.next_victim(ObjectKind.KV) is None
    assert pol.next_victim(ObjectKind.STATE) in (short_leaf, long_leaf)  # state locks differ


def test_only_the_last_node_is_refreshed(geo, sim_config) -> None:
    sim, pol, short_leaf, _ = _two_leaves(geo, sim_config, 300, 2000)
    parent = sim.cache.tree.root
    before = {n.id: n.last_access for n in sim.cache.tree.nodes()}
    pol.on_access([short_leaf], 99.0)
    assert short_leaf.last_access == 99.0
    assert all(n.last_access == before[n.id] for n in sim.cache.tree.nodes() if n is not short_leaf)
    assert parent.last_access == 0.0


def test_build_maps_config_names(geo) -> None:
    ev = build.eviction(load_config(None, {"eviction": "marconi"}, environ={}))
    assert isinstance(ev, MarconiEviction) and ev.auto
    ref = build.eviction(load_config(None, {"eviction": "marconi_reference", "alpha": 0.5}, environ={}))
    assert isinstance(ref, MarconiEviction) and ref.alpha == 0.5 and not ref.auto
    assert ref._accounting_factory is ReferenceAccounting
    assert isinstance(build.eviction(load_config(None, {"eviction": "lru"}, environ={})), LRUEviction)
    assert build.objective(load_config(None, {"eviction": "marconi_reference", "alpha_objective": "token_hits"}, environ={})) == "flops"


def test_default_cache_with_marconi_runs_and_tunes(geo) -> None:
    """The build path a live cache takes: auto alpha, tuner made at the first eviction from
    the byte snapshot, replays on a worker thread."""
    cfg = load_config(None, {"eviction": "marconi", "chunk_size": 256, "hash_block_size": 256,
                             "alignment": 1, "bootstrap_multiplier": 2, "alpha_grid": [0.0, 1.0],
                             "alpha_tuner": "window"},
                      environ={})
    pol = assemble.policies(cfg).eviction   # with the simulator's replayer injected
    assert isinstance(pol, MarconiEviction)
    sim = Simulator(cfg, geo, Budget.pooled(int(0.6e9)), eviction=pol)
    recs = multi_turn_chat(30, 5, 5, lengths="sharegpt", as_arrays=True)
    _replay(sim, recs)
    assert pol.tuner is not None and pol.tuner.started
    pol.tuner.close()  # waits for a running round
    pol._adopt()
    assert pol.tuner.history, "a tuning round ran"
    assert pol.alpha in (0.0, 1.0)


def test_index_matches_full_walk_under_state_pressure_with_placement(geo, sim_config) -> None:
    """Many single-child checkpoints (placement) and a tight state pool: STATE victims,
    merges and chain re-basing all go through the incremental index."""
    from hybrid_connector.policies.admission.checkpoints import MarconiAdmission
    from hybrid_connector.policies.admission.placement_hook import PlacementAdmission

    pol = Checked(alpha=1.5)
    budget = Budget.per_kind({ObjectKind.KV: int(3e9), ObjectKind.STATE: int(0.6e9)})
    adm = PlacementAdmission(MarconiAdmission(), slots=4, replan_every=1)
    sim = Simulator(sim_config, geo, budget, eviction=pol, admission=adm)
    recs = shared_document_qa(3, 60, 4, doc_tokens=(3000, 8000), full_doc_prob=0.2, as_arrays=True)
    _replay(sim, recs)
    assert pol.checked > 50 and sim.cache.stats.evicted["state"] > 0
