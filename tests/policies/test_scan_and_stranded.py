"""``MarconiEviction(scan_resistant=True)`` under a tight budget shared by KV and states
(``pools.host.kv_state``): no KV is left stranded without the state that makes it useful,
prefixes reused in a cycle a little longer than the budget still hit
(``eviction.scan_guard``), and reuse within the budget keeps what plain recency keeps."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.eviction.marconi_fullwalk import FullWalkMarconi
from hybrid_connector.policies.eviction.stranded import is_stranded
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.tiers.size_only import Budget

GEO = get_preset("marconi-7b")
CFG = load_config(None, {"chunk_size": 256, "hash_block_size": 8, "alignment": 8},
                  environ={})
SYSTEM = np.arange(600) + 1_000_000  # a shared system prompt, not on the chunk grid


def _user(u: int, rounds: int) -> list[np.ndarray]:
    """One user's prompts: the system prompt, 1,024 own tokens, then 256 more per round."""
    rng = np.random.default_rng(u)
    ctx = np.r_[SYSTEM, rng.integers(0, 30_000, 1024)]
    out = []
    for _ in range(rounds):
        out.append(ctx)
        ctx = np.r_[ctx, rng.integers(0, 30_000, 256)]
    return out


def _user_bytes(tokens: int) -> int:
    return tokens * GEO.kv_bytes_per_token() + GEO.state_bytes()


def _cycle(users: int, rounds: int, room_for: float, scan: bool) -> tuple[int, int, Simulator]:
    """Users in turn, ``rounds`` prompts each, a pooled budget for ``room_for`` users' first
    prompts: (hit tokens, KV bytes left stranded at the end, the simulator)."""
    budget = int(room_for * _user_bytes(1536 + 256))
    pol = MarconiEviction(alpha=0.0, refresh_path=True, scan_resistant=scan)
    prompts = [_user(u, rounds) for u in range(users)]
    sim = Simulator(CFG, GEO, Budget.pooled(budget), eviction=pol)
    hits = 0
    for r in range(rounds):
        for u in range(users):
            hits += sim.step(prompts[u][r], np.arange(8) + 7).hit
    tree = sim.cache.index.tree
    stranded = sum(n.nbytes(ObjectKind.KV) for n in tree.nodes()
                   if n is not tree.root and is_stranded(n))
    return hits, stranded, sim


def test_a_state_victim_on_a_leaf_takes_its_kv_along() -> None:
    """Evicting a leaf's state alone would leave its KV in the shared budget, useless (the
    system prompt's checkpoint sits inside each user's first chunk, so the index keeps
    such a leaf: it cannot tell the chunk is not the only KV under that checkpoint)."""
    _, stranded, sim = _cycle(users=6, rounds=3, room_for=3.5, scan=True)
    try:
        assert sim.cache.stats.evicted["state"] > 0
        assert stranded == 0, stranded
        sim.cache.check_integrity()
    finally:
        sim.close()


def test_a_cycle_longer_than_the_budget_still_hits() -> None:
    """Ten users in turn with room for about nine: recency evicts the next user every time;
    the scan guard keeps most of them."""
    rounds = 12
    plain, _, s1 = _cycle(users=10, rounds=rounds, room_for=9.0, scan=False)
    guarded, _, s2 = _cycle(users=10, rounds=rounds, room_for=9.0, scan=True)
    s1.close()
    s2.close()
    system_only = len(SYSTEM) * 10 * rounds  # every request hits the shared system prompt
    assert plain <= system_only  # recency: no user's own prefix is ever still there
    assert guarded > system_only + 8 * 1536, (plain, guarded)  # at least 8 users' hits


def test_reuse_within_the_budget_is_kept_as_recency_keeps_it() -> None:
    """Four users in turn with room for six: nothing cycles past the budget, and the guard
    changes nothing."""
    plain, _, s1 = _cycle(users=4, rounds=5, room_for=6.0, scan=False)
    guarded, _, s2 = _cycle(users=4, rounds=5, room_for=6.0, scan=True)
    s1.close()
    s2.close()
    assert guarded == plain > 0


def test_the_shipped_vllm_configs_build_a_scan_resistant_eviction() -> None:
    """``scan_resistant`` is a config key (off by default); the vLLM configs turn it on,
    and the policy built from them (every tuner candidate included) has it."""
    from pathlib import Path

    from hybrid_connector.policies.build import marconi_options

    assert marconi_options(CFG)["scan_resistant"] is False
    root = Path(__file__).resolve().parents[2] / "configs"
    for name in ("vllm.yaml", "vllm-qwen3_5.yaml", "vllm-nemotron_h.yaml"):
        cfg = load_config(root / name, environ={})
        assert cfg.scan_resistant, name
        assert marconi_options(cfg)["scan_resistant"] is True, name


@pytest.mark.parametrize("policy", [MarconiEviction, FullWalkMarconi])
def test_a_shared_prefix_state_waits_while_leaves_of_the_other_class_can_go(
        policy: type[MarconiEviction]) -> None:
    """The guard's class first (the unproven) holds no leaf state to give, only the state at
    a branch point: the system prompt's, under every session's chain. The victim is a
    leaf's state of the other class. Before, the class-restricted ranking fell through to
    its O(N) fallback and took the system prompt's state: the head-to-head's chat at 1x
    reached this with 48 proven leaf states and the four system prompts' states unproven,
    and later sessions and turns whose own chain was gone recomputed from token 0. The
    O(N) reference (``FullWalkMarconi``) chooses alike."""
    pol = policy(alpha=0.0, refresh_path=False, scan_resistant=True)
    sim = Simulator(CFG, GEO, Budget.pooled(1 << 40), eviction=pol)
    try:
        rng = np.random.default_rng(0)
        first = [np.r_[SYSTEM, rng.integers(0, 30_000, 1024)] for _ in range(2)]
        out = np.arange(8) + 7
        for p in first:
            sim.step(p, out)
        for p in first:
            assert sim.step(np.r_[p, out, rng.integers(0, 30_000, 64)], out).hit > len(SYSTEM)
        tree = sim.cache.index.tree
        shared = tree.match(SYSTEM).node
        assert shared.depth == len(SYSTEM) and shared.state is not None and len(shared.children) == 2
        # the guard's state in that run: every leaf state proven, the unproven over room
        pol.guard.proven |= {n.id for n in tree.nodes()
                             if n.state is not None and len(n.children) <= 1}
        pol.guard._room = 0.0
        assert pol.guard.victim_class() is False
        victim = pol.next_victim(ObjectKind.STATE)
        assert victim is not None and victim is not shared and len(victim.children) <= 1
    finally:
        sim.close()
