"""``MarconiEviction(scan_resistant=True, fallback_first=True)`` in a budget KV and states share: when a KV save
needs room, a *fallback* state (one whose single-child chain below holds a deeper state)
goes before any leaf's KV (``eviction.marconi_victims``), so sessions that only ever
extend their context keep their deepest hit instead of losing whole prefixes."""

from __future__ import annotations

import numpy as np

from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.eviction.marconi_victims import shadowed
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.tiers.size_only import Budget

GEO = get_preset("marconi-7b")
CFG = load_config(None, {"chunk_size": 256, "hash_block_size": 8, "alignment": 8,
                         "save_decode_cache": True}, environ={})
SYSTEM = np.arange(300) + 1_000_000


def _sessions(n: int, turns: int, step: int = 300) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """``n`` agents: the system prompt, 500 own tokens, then per turn an 8-token answer
    (resent in the next prompt, as chat clients and agents do) and ``step`` more tokens."""
    out = []
    for s in range(n):
        rng = np.random.default_rng(s)
        ctx = np.r_[SYSTEM, rng.integers(0, 30_000, 500)]
        turns_of = []
        for _ in range(turns):
            answer = rng.integers(0, 30_000, 8)
            turns_of.append((ctx, answer))
            ctx = np.r_[ctx, answer, rng.integers(0, 30_000, step)]
        out.append(turns_of)
    return out


def _run(budget: int, sessions: int, turns: int) -> tuple[list[list[int]], Simulator, MarconiEviction]:
    """Hits per turn (one per agent) and the simulator (``save_decode_cache``: answers
    are stored with their end state)."""
    pol = MarconiEviction(alpha=0.0, scan_resistant=True, fallback_first=True)
    sim = Simulator(CFG, GEO, Budget.pooled(budget), eviction=pol)
    hits = []
    prompts = _sessions(sessions, turns)
    for t in range(turns):
        hits.append([sim.step(*prompts[s][t]).hit for s in range(sessions)])
    return hits, sim, pol


def test_a_kv_save_evicts_a_fallback_state_before_a_leaf() -> None:
    _, sim, pol = _run(1 << 40, sessions=3, turns=4)  # nothing evicted yet
    try:
        tree = sim.cache.index.tree
        assert any(n.state is not None and shadowed(n) for n in tree.nodes())
        order = pol.victim_kinds((ObjectKind.KV, ObjectKind.STATE))
        assert order[0] is ObjectKind.STATE
        victim = pol.next_victim(ObjectKind.STATE)
        assert victim is not None and victim.state is not None and shadowed(victim)
    finally:
        sim.close()


def test_agents_keep_their_deepest_hit_when_kv_and_two_states_each_fit() -> None:
    """Six agents in turn; room for every agent's final context and two states each.
    Every agent's last turn hits its whole previous context (prompt and answer). Kind order
    alone (KV leaves before any state) let each turn's prompt checkpoint and answer state
    fill the pool and evicted whole agents: last turn [2040, 1424, 2040, 1424, 808, 1424]."""
    sessions, turns = 6, 6
    final = len(SYSTEM) + 500 + 308 * (turns - 1)
    budget = int(sessions * (final * GEO.kv_bytes_per_token() + 2 * GEO.state_bytes()))
    hits, sim, _ = _run(budget, sessions, turns)
    sim.close()
    assert hits[-1] == [final - 300] * sessions, hits
