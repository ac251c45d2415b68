"""Alpha tuner: when it runs, what it picks, drift, threads; and on real replays."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector.policies.admission.checkpoints import MarconiAdmission
from hybrid_connector.policies.eviction.accounting import CorrectedAccounting
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.tuning.grid import AlphaTuner, TunerRequest
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.runtime.tuner_caches import CacheReplayer
from hybrid_connector.sim.traces import agentic, multi_turn_chat
from hybrid_connector.tiers.size_only import Budget


def _req(n: int) -> tuple[np.ndarray, int]:
    return np.arange(3, 3 + n), n - 1


def length_replayer(window, alpha, eval_from) -> float:
    """Scores alpha by closeness to (mean prompt length / 1000) over the evaluated part."""
    target = float(np.mean([r.prompt_len for r in window[eval_from:]])) / 1000.0
    return -abs(alpha - target)


def test_no_tuning_before_the_first_eviction_then_at_multiplier_times_r() -> None:
    t = AlphaTuner(length_replayer, grid=(0.0, 1.0, 2.0), bootstrap_multiplier=3,
                   retune_interval=0, background=False, min_window=1)
    for _ in range(10):
        t.record(*_req(1000))
    assert t.poll() is None and not t.history
    t.start(4)  # first eviction after 4 requests: tune once 12 are seen
    t.record(*_req(1000))
    assert t.poll() is None
    t.record(*_req(1000))
    assert t.poll() == 1.0 and t.history[0].window == 12
    for _ in range(50):
        t.record(*_req(2000))
    assert t.poll() is None  # retune_interval 0: never again


def test_retuning_follows_drift() -> None:
    t = AlphaTuner(length_replayer, grid=(0.0, 1.0, 2.0), bootstrap_multiplier=2,
                   retune_interval=5, background=False, min_window=1)
    t.start(3)
    got = []
    for n in [1000] * 6 + [2000] * 12 + [10] * 12:
        t.record(*_req(n))
        a = t.poll()
        if a is not None:
            got.append(a)
    assert got[0] == 1.0 and 2.0 in got and got[-1] == 0.0


def test_ties_keep_the_current_alpha_and_bad_input_raises() -> None:
    t = AlphaTuner(lambda w, a, e: 1.0, grid=(0.0, 0.5), background=False)
    t.current = 0.5
    assert t.search([TunerRequest(np.arange(3, 10), 3)] * 4).chosen == 0.5
    with pytest.raises(ValueError):
        AlphaTuner(length_replayer, grid=())
    with pytest.raises(ValueError):
        t.record(np.arange(3, 10), 0)


def test_background_thread_round() -> None:
    t = AlphaTuner(length_replayer, grid=(0.0, 2.0), bootstrap_multiplier=1,
                   retune_interval=0, background=True, min_window=1)
    t.start(2)
    t.record(*_req(1800))
    t.record(*_req(1800))
    t.close()  # joins the worker
    assert t.poll() == 2.0


def test_real_replays_pick_different_alphas_for_different_workloads(geo, sim_config) -> None:
    """Through the real cache: the grid search's scores differ across alphas and across
    workloads, and the policy adopts the tuner's choice."""
    budget = Budget.pooled(int(1e9))  # small enough that eviction decides the hit rate
    replayer = CacheReplayer(sim_config, geo, budget, MarconiAdmission, CorrectedAccounting)
    grid = (0.0, 2.0)
    agent = agentic(6, 14, 0, sessions_per_second=1.0, side_calls=2.0, as_arrays=True)
    chat = multi_turn_chat(30, 6, 1, lengths="sharegpt", num_system_prompts=2, as_arrays=True)
    choices = {}
    for name, recs in (("agentic", agent), ("chat", chat)):
        window = [TunerRequest(np.concatenate([r["input_tokens"], r["output_tokens"]]),
                               len(r["input_tokens"])) for r in recs]
        t = AlphaTuner(replayer, grid=grid, background=False)
        rnd = t.search(window)
        assert rnd.scores[0.0] != rnd.scores[2.0], name
        choices[name] = rnd.chosen
    # Agent contexts are worth protecting per byte; short one-shot chats are not.
    assert choices == {"agentic": 2.0, "chat": 0.0}, choices
    # The policy side: an auto policy adopts what its tuner reports.
    tuner = AlphaTuner(replayer, grid=grid, bootstrap_multiplier=1, retune_interval=0,
                       background=False)
    pol = MarconiEviction(alpha=None, tuner=tuner)
    sim = Simulator(sim_config, geo, budget, eviction=pol)
    for r in agent:
        sim.step(r["input_tokens"], r["output_tokens"])
    assert tuner.history and pol.alpha == tuner.history[-1].chosen
    assert pol.alpha_history


# ---------------------------------------------------------------- issue 9, item 22
def test_cache_close_stops_the_tuner_thread_and_is_idempotent(geo, sim_config) -> None:
    import threading

    from hybrid_connector.policies.eviction.lru import LRUEviction

    tuner = AlphaTuner(length_replayer, grid=(0.0, 1.0), bootstrap_multiplier=1,
                       retune_interval=0, background=True, min_window=1)
    pol = MarconiEviction(alpha=None, tuner=tuner)
    # Room for about two requests: evictions start early, so a round is launched.
    sim = Simulator(sim_config, geo, Budget.pooled(int(3e8)), eviction=pol)
    rng = np.random.default_rng(0)
    for _ in range(6):
        sim.step(rng.integers(3, 9000, size=1000), np.array([5]))
    assert tuner._pool is not None, "no tuning round ran on the worker thread"
    workers = list(tuner._pool._threads)
    assert workers and all(t.is_alive() for t in workers)
    sim.cache.close()
    assert not any(t.is_alive() for t in workers)
    assert not set(workers) & set(threading.enumerate())
    sim.cache.close()  # idempotent, and so are the policy's and the tuner's own close
    pol.close()
    tuner.close()
    LRUEviction().close()  # the base policy's close is a no-op


def test_a_closed_tuner_never_starts_another_thread() -> None:
    t = AlphaTuner(length_replayer, grid=(0.0, 2.0), bootstrap_multiplier=1,
                   retune_interval=1, background=True, min_window=1)
    t.start(1)
    t.record(*_req(1800))
    t.close()
    assert t.poll() == 2.0  # the round in flight finished and is still handed over
    for _ in range(3):  # retune_interval 1: each request is due a round
        t.record(*_req(10))
        t.poll()
    assert t._pool is None and t.current == 0.0  # later rounds ran inline


def test_twins_hash_a_request_once_and_score_as_if_they_hashed_it(geo, sim_config,
                                                                   monkeypatch) -> None:
    """Every twin serves the request with the prefix hashes ``TunerRequest`` computed once
    (``RequestSession``'s ``ahead``): the same scores as twins that hash it themselves."""
    from hybrid_connector.core import hashes as hashes_mod
    from hybrid_connector.policies.tuning.base import Candidate
    from hybrid_connector.runtime.tuner_caches import CacheShadow

    budget = Budget.pooled(int(1e9))
    replayer = CacheReplayer(sim_config, geo, budget, MarconiAdmission, CorrectedAccounting,
                             objective="token_hits")
    recs = multi_turn_chat(10, 4, 1, num_system_prompts=2, as_arrays=True)
    reqs = [TunerRequest(np.concatenate([r["input_tokens"], r["output_tokens"]]),
                         len(r["input_tokens"])) for r in recs]
    twins = [CacheShadow(replayer, Candidate(a)) for a in (0.0, 2.0)]
    own = [CacheShadow(replayer, Candidate(a)) for a in (0.0, 2.0)]
    blocks = [0]
    real = hashes_mod._h
    monkeypatch.setattr(hashes_mod, "_h", lambda *a: blocks.__setitem__(0, blocks[0] + 1) or real(*a))
    shared = [[t.step(r) for t in twins] for r in reqs]
    assert blocks[0] == 0                 # full blocks came from the request's one hasher
    alone = [[replayer.score(t.sim.step(r.tokens[: r.prompt_len], r.tokens[r.prompt_len:]).hit)
              for t in own] for r in reqs]  # no ``ahead``: each twin hashes the request
    assert blocks[0] > 0 and shared == alone and sum(map(sum, shared)) > 0
    for t in twins + own:
        t.close()


def test_a_tuners_log_keeps_no_hashes_once_every_twin_has_stepped(geo, sim_config) -> None:
    """The shared hashes (~3.6 B a token) are dropped once every twin stepped the request:
    the shadow tuner's log keeps the tokens only, as before."""
    from hybrid_connector.policies.tuning.shadow import ShadowTuner
    from hybrid_connector.runtime.tuner_caches import shadow_factory

    replayer = CacheReplayer(sim_config, geo, Budget.pooled(int(1e9)), MarconiAdmission,
                             CorrectedAccounting, objective="token_hits")
    t = ShadowTuner(shadow_factory(replayer), background=False)
    for r in multi_turn_chat(4, 3, 1, as_arrays=True):
        t.record(np.concatenate([r["input_tokens"], r["output_tokens"]]), len(r["input_tokens"]))
    assert t._log and all(not req._hashers for req in t._log)
    window = list(t._log)
    AlphaTuner(replayer, grid=(0.0, 2.0), background=False).search(window)
    assert all(not req._hashers for req in window)
    t.close()
