"""``eviction.scan_guard``: a prefix proven on its ghost (a cycle longer than the budget
came back) turns unproven again once no access reached it over a capacity of intake, while
the proven class earns fewer hits than the unproven one, so prefixes that stopped
returning do not hold the budget against newcomers (the Mooncake replay's conversations
come back once at 1-2x the budget and then mostly never)."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector.core.config import load_config
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.policies.eviction import scan_guard
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.tiers.size_only import Budget
from hybrid_connector.tree.nodes import Node

GEO = get_preset("marconi-7b")
CFG = load_config(None, {"chunk_size": 256, "hash_block_size": 8, "alignment": 8},
                  environ={})
SYSTEM = np.arange(600) + 1_000_000  # a shared system prompt
OUT = np.arange(8) + 7


def _tokens(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 30_000, n)


def _conversations(sim: Simulator, seed: int, count: int, lag: int) -> list[bool]:
    """``count`` new conversations that each come back once, ``lag`` conversations later:
    whether each follow-up hit its own prefix (more than the system prompt)."""
    first = [np.r_[SYSTEM, _tokens(seed + u, 1024)] for u in range(count)]
    hit: list[bool] = []
    for i in range(count + lag):
        if i < count:
            sim.step(first[i], OUT)
        if i >= lag:
            follow_up = np.r_[first[i - lag], OUT, _tokens(seed + 500 + i, 256)]
            hit.append(sim.step(follow_up, OUT).hit > len(SYSTEM))
    return hit


def _newcomer_hits() -> tuple[list[bool], MarconiEviction]:
    """20 conversations that come back once (hits on unproven prefixes), then ten users in
    turn for four rounds with room for about nine (their prefixes come back past the
    budget and are proven on their ghosts), then 30 new conversations that come back once,
    three conversations later: whether each of those follow-ups hit."""
    budget = int(9 * ((1536 + 256) * GEO.kv_bytes_per_token() + GEO.state_bytes()))
    pol = MarconiEviction(alpha=0.0, refresh_path=True, scan_resistant=True)
    sim = Simulator(CFG, GEO, Budget.pooled(budget), eviction=pol)
    _conversations(sim, 3000, 20, 3)
    ctx = [np.r_[SYSTEM, _tokens(u, 1024)] for u in range(10)]
    for _ in range(4):
        for u in range(10):
            sim.step(ctx[u], OUT)
            ctx[u] = np.r_[ctx[u], _tokens(100 + u, 256)]
    assert pol.guard.ghost_hits > 0 and pol.guard.proven_bytes > 0  # the cycle is protected
    hit = _conversations(sim, 1000, 30, 3)
    sim.close()
    return hit, pol


def test_newcomers_hit_once_the_cycle_they_replace_has_idled_a_capacity() -> None:
    """About eleven newcomers take in 1.25 capacities: by then the cycle's ghost-proven
    prefixes have turned unproven and newcomers' follow-ups hit their own prefixes (the
    7th newcomer's first). Before, the cycle kept the proven class (``room`` at 0:
    newcomers went first) and the first follow-up to hit was the 14th (12 of 30 hit,
    13 now)."""
    hit, pol = _newcomer_hits()
    assert pol.guard.aged > 0
    assert True in hit[:10], hit
    assert sum(hit) >= 13, hit


def _third_turns_then_newcomers() -> tuple[list[bool], MarconiEviction]:
    """30 conversations whose second turn comes 16 conversations later (past the budget:
    re-created on its ghost, so proven) and whose third turn follows at once (a hit, and
    an extension of a proven leaf: proven, but not on a ghost), then never again; then 40
    new conversations that each come back once, four conversations later: whether each
    of those follow-ups hit."""
    per = (1024 + 256) * GEO.kv_bytes_per_token() + GEO.state_bytes()
    pol = MarconiEviction(alpha=0.0, refresh_path=True, scan_resistant=True)
    sim = Simulator(CFG, GEO, Budget.pooled(int(9 * per)), eviction=pol)
    first = [_tokens(u, 1024) for u in range(30)]
    for i in range(30 + 16):
        if i < 30:
            sim.step(first[i], OUT)
        if i >= 16:
            second = np.r_[first[i - 16], OUT, _tokens(50_000 + i, 128)]
            sim.step(second, OUT)
            assert sim.step(np.r_[second, OUT, _tokens(60_000 + i, 128)], OUT).hit > 0
    assert pol.guard.ghost_hits > 0 and pol.guard.proven_hits > 0
    new = [_tokens(90_000 + u, 1024) for u in range(40)]
    hit: list[bool] = []
    for i in range(40 + 4):
        if i < 40:
            sim.step(new[i], OUT)
        if i >= 4:
            follow_up = np.r_[new[i - 4], OUT, _tokens(70_000 + i, 256)]
            hit.append(sim.step(follow_up, OUT).hit > 0)
    sim.close()
    return hit, pol


def test_third_turns_that_stop_returning_age_out_like_ghost_proven_ones() -> None:
    """The third turns' leaves were proven without a ghost; once they idle a capacity of
    intake while the newcomers' hits (unproven) outnumber proven ones over the last
    capacity, they turn unproven, and the first newcomer's follow-up hits. Before, only
    ghost-proven leaves aged (none here: each has its third turn below it), the third
    turns held the proven class and the first follow-up to hit was the 7th."""
    hit, pol = _third_turns_then_newcomers()
    assert pol.guard.aged > 0
    assert hit[0], hit


def test_a_cycle_protected_in_after_many_unproven_hits_keeps_its_leaves() -> None:
    """40 conversations that come back once (40 unproven hits), then ten users in turn
    with room for about seven: the cycle's proven leaves idle past a capacity of intake
    while it is being protected in, but over the last capacity the proven hits win, so
    they stay proven and the cycle keeps hitting. Gated on the hits over the whole run
    instead (where the unproven lead from the start), they turned unproven and the last
    four rounds hit nothing."""
    budget = int(7 * ((1536 + 256) * GEO.kv_bytes_per_token() + GEO.state_bytes()))
    pol = MarconiEviction(alpha=0.0, refresh_path=True, scan_resistant=True)
    sim = Simulator(CFG, GEO, Budget.pooled(budget), eviction=pol)
    _conversations(sim, 3000, 40, 3)
    ctx = [np.r_[SYSTEM, _tokens(u, 1024)] for u in range(10)]
    late = 0
    for r in range(10):
        for u in range(10):
            got = sim.step(ctx[u], OUT).hit > len(SYSTEM) + 200
            late += got and r >= 6
            ctx[u] = np.r_[ctx[u], OUT, _tokens(100 + u + 1000 * r, 128)]
    sim.close()
    assert late >= 8, late


def test_the_recent_hit_tally_is_bounded_when_hits_take_in_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Hits that add no bytes do not move the last-capacity window on; the tally keeps at
    most ``RECENT`` of them, the counts matching what it keeps."""
    monkeypatch.setattr(scan_guard, "RECENT", 8)
    guard = scan_guard.ScanGuard()
    node = Node(1, None, np.arange(4), 4)
    for i in range(50):
        node.hits += 1
        guard.refresh(node, 1000, float(i))
    assert len(guard._recent) == 8
    assert sum(guard._recent_hits) == 8
