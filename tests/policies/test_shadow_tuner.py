"""Shadow tuner: decisions on paired evidence only, fallback to LRU, grid reach, threads;
and on real twin caches: alpha 0 on the one-shot chat family, alpha > 0 on agentic."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector import assemble
from hybrid_connector.core.config import load_config
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.tuning.base import LRU, Candidate, TunerRequest
from hybrid_connector.policies.tuning.shadow import ShadowTuner, candidates
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.sim.baselines import baseline_specs
from hybrid_connector.sim.simulate import run_once
from hybrid_connector.sim.traces import GENERATORS
from hybrid_connector.tiers.size_only import Budget


class Scripted:
    """A twin whose score per request is ``mean(alpha) + noise`` (seeded per candidate)."""

    def __init__(self, cand: Candidate, mean, noise: float = 1.0) -> None:
        self.cand, self.mean, self.noise = cand, mean, noise
        self.rng = np.random.default_rng(int(cand.alpha * 1000) + cand.refresh_path)
        self.steps = 0
        self.closed = False

    def step(self, request: TunerRequest) -> float:
        self.steps += 1
        return float(self.mean(self.cand) + self.noise * self.rng.standard_normal())

    def close(self) -> None:
        self.closed = True


def _feed(t: ShadowTuner, n: int) -> list[Candidate]:
    got = []
    for _ in range(n):
        t.record(np.arange(3, 20), 10)
        c = t.poll()
        if c is not None:
            got.append(c)
    return got


def test_noise_alone_never_switches() -> None:
    twins: list[Scripted] = []

    def make(c: Candidate) -> Scripted:
        twins.append(Scripted(c, lambda c: 10.0, noise=3.0))
        return twins[-1]

    # at the long-run threshold (the early one, tested below, may act on noise among ties)
    t = ShadowTuner(make, candidates((0.0, 0.5, 1.0, 2.0)), z_early=3.0, background=False)
    t.start(0)
    assert _feed(t, 1500) == [] and t.current == LRU
    assert all(tw.steps == 1500 for tw in twins)


def test_a_modest_gain_switches_early_at_the_lower_early_threshold() -> None:
    """A gain of 0.3 per request under noise 3: the early threshold (z 1.5 for the first
    200 requests after the first eviction, from the 4th block on) takes it; z 3 throughout
    is still waiting after 200 requests."""
    def make(c: Candidate) -> Scripted:
        return Scripted(c, lambda c: 10.0 + 0.3 * (c.alpha == 2.0), noise=3.0)

    early = ShadowTuner(make, candidates((0.0, 1.0, 2.0)), background=False)
    early.start(0)
    assert _feed(early, 200) == [Candidate(2.0)]
    assert early.history[0].at_request >= 4 * early.block
    late = ShadowTuner(make, candidates((0.0, 1.0, 2.0)), z_early=3.0, background=False)
    late.start(0)
    assert _feed(late, 200) == []


def test_a_consistent_gain_switches_once_and_not_before_the_first_eviction() -> None:
    t = ShadowTuner(lambda c: Scripted(c, lambda c: 10.0 + (c.alpha == 2.0)), candidates((0.0, 1.0, 2.0)),
                    start=Candidate(1.0), background=False)
    assert _feed(t, 200) == []  # before start: no decision, however clear
    t.start(200)
    assert _feed(t, 200) == [Candidate(2.0)] and t.current == Candidate(2.0)
    assert t.history[0].gain > t.history[0].noise > 0


def test_falls_back_to_lru_on_weaker_evidence_than_a_move_away_needs() -> None:
    """A gain of 0.2 per request (noise 1): enough at z_fallback 1 for LRU within 300
    requests, not for another alpha at z 4."""
    def mean(gainer: Candidate):
        return lambda c: 10.0 + 0.2 * (c == gainer)

    lru = ShadowTuner(lambda c: Scripted(c, mean(LRU)), candidates((1.0, 2.0)), z=4.0, z_fallback=1.0,
                      start=Candidate(1.0), background=False)
    lru.start(0)
    assert _feed(lru, 300) == [LRU]
    other = ShadowTuner(lambda c: Scripted(c, mean(Candidate(2.0))), candidates((1.0, 2.0)), z=4.0,
                        z_early=4.0, z_fallback=1.0, start=Candidate(1.0), background=False)
    other.start(0)
    assert _feed(other, 300) == []


def test_grid_grows_while_its_largest_alpha_leads() -> None:
    made: list[Candidate] = []

    def make(c: Candidate) -> Scripted:
        made.append(c)
        return Scripted(c, lambda c: min(c.alpha, 16.0), noise=0.5)

    t = ShadowTuner(make, candidates((0.0, 1.0, 2.0), path_lru=False), start=Candidate(1.0),
                    max_alpha=32.0, background=False)
    t.start(0)
    _feed(t, 400)
    alphas = sorted(c.alpha for c in t.offered)
    assert alphas[-1] == 32.0 and 16.0 in alphas  # doubled up to the cap, flat past 16
    assert t.current.alpha >= 16.0


def test_background_steps_off_the_callers_thread_and_close_is_idempotent() -> None:
    twins: list[Scripted] = []

    def make(c: Candidate) -> Scripted:
        twins.append(Scripted(c, lambda c: 10.0 + 5 * (c == LRU), noise=0.1))
        return twins[-1]

    t = ShadowTuner(make, candidates((1.0,)), start=Candidate(1.0), background=True, max_backlog=1000)
    t.start(0)
    for _ in range(100):
        t.record(np.arange(3, 20), 10)
    t.drain()
    t.close()
    assert t.poll() == LRU and t.poll() is None
    t.close()
    assert all(tw.closed and tw.steps == 100 for tw in twins) and t.skipped == 0


def test_a_worker_behind_skips_requests_for_every_shadow_and_close_drops_the_queue() -> None:
    import threading

    gate = threading.Event()

    class Slow(Scripted):
        def step(self, request: TunerRequest) -> float:
            gate.wait(5)
            return super().step(request)

    twins: list[Slow] = []

    def make(c: Candidate) -> Slow:
        twins.append(Slow(c, lambda c: 1.0))
        return twins[-1]

    t = ShadowTuner(make, candidates((1.0,)), background=True, max_backlog=8)
    for _ in range(50):
        t.record(np.arange(3, 20), 10)
    assert t.skipped == 50 - 8
    gate.set()
    t.close()  # the running step finishes, the queued ones are dropped
    assert len({tw.steps for tw in twins}) == 1 and twins[0].steps <= 8


class Burning(Scripted):
    """A twin whose step takes ``burn`` seconds of its thread's CPU time."""

    burn = 0.002
    cpu = 0.0  # CPU seconds all twins spent stepping
    first: float | None = None  # wall clock of the first step's start

    def step(self, request: TunerRequest) -> float:
        import time

        if Burning.first is None:
            Burning.first = time.perf_counter()
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.burn:
            pass
        Burning.cpu += time.thread_time() - t0
        return super().step(request)


@pytest.mark.parametrize("deterministic", [False, True])
def test_cpu_share_bounds_the_workers_cpu_unless_deterministic(deterministic) -> None:
    """With ``cpu_share`` the worker sleeps off CPU time beyond that share of the wall time
    since its first step (what it cannot keep up with is skipped), so an engine thread in
    the same process waits on it for at most that share; a deterministic tuner never
    skips, and ignores it."""
    import time

    Burning.cpu, Burning.first = 0.0, None
    share = 0.05  # a 2 ms step then owes ~38 ms of sleep: no machine is that slow
    t = ShadowTuner(lambda c: Burning(c, lambda c: 1.0), candidates((1.0,)),
                    background=True, max_backlog=4, deterministic=deterministic,
                    cpu_share=share)
    for _ in range(30):
        t.record(np.arange(3, 20), 10)
    t.drain()
    elapsed = time.perf_counter() - (Burning.first or 0.0)
    t.close()
    if deterministic:
        assert t.slept_s == 0 and t.skipped == 0
        return
    assert t.slept_s > 0 and t.skipped > 0
    assert Burning.cpu <= share * elapsed * 1.05 + Burning.burn


def test_idle_time_banks_no_long_burst_under_cpu_share() -> None:
    """Time the worker spends idle is not a budget for a later burst at full speed: the
    credit is capped (``MAX_CREDIT_S``), so a burst after half a second of idling is held
    to ``cpu_share`` within a few steps (uncapped, its first dozen steps would run
    unthrottled)."""
    import time

    Burning.cpu, Burning.first = 0.0, None
    t = ShadowTuner(lambda c: Burning(c, lambda c: 1.0), candidates((1.0,)),
                    background=True, max_backlog=6, cpu_share=0.05)
    t.record(np.arange(3, 20), 10)
    t.drain()
    time.sleep(0.5)
    before = t.slept_s
    for _ in range(30):
        t.record(np.arange(3, 20), 10)
    t.drain()
    t.close()
    assert t.slept_s > before


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        ShadowTuner(lambda c: Scripted(c, lambda c: 0.0), ())
    with pytest.raises(ValueError, match="start"):
        ShadowTuner(lambda c: Scripted(c, lambda c: 0.0), candidates((0.0,)), start=Candidate(3.0))
    for share in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="cpu_share"):
            ShadowTuner(lambda c: Scripted(c, lambda c: 0.0), cpu_share=share)
    t = ShadowTuner(lambda c: Scripted(c, lambda c: 0.0), background=False)
    with pytest.raises(ValueError):
        t.record(np.arange(5), 0)


# ---------------------------------------------------------------- on real twin caches
GEO = get_preset("marconi-7b")
SPECS = {s.name: s for s in baseline_specs(GEO, include_reference=False)}
BASE = {"alpha_objective": "token_hits"}


def _footprint(recs) -> int:
    from hybrid_connector.tree.radix import RadixTree

    tree = RadixTree()
    for r in recs:
        tree.insert(np.concatenate([r["input_tokens"], r["output_tokens"]]))
    return sum(int(n.tokens.size) for n in tree.nodes()) * GEO.kv_bytes_per_token()


@pytest.mark.parametrize(("kind", "args", "frac"), [
    ("oneshot", (200, 3, 0), 0.25),
    ("agentic", (6, 12, 0), 0.06),
])
def test_picks_lru_on_one_shot_chat_and_alpha_above_zero_on_agentic(kind, args, frac) -> None:
    kw = {"sessions_per_second": 1.0, "side_calls": 2.0} if kind == "agentic" else {}
    recs = GENERATORS[kind](*args, as_arrays=True, **kw)  # type: ignore[operator]
    size = int(_footprint(recs) * frac)
    auto = run_once(recs, SPECS["marconi"], GEO, size, base=BASE)
    lru = run_once(recs, SPECS["sglang"], GEO, size, base=BASE)
    if kind == "oneshot":
        assert auto.alpha == 0.0, auto.alpha_history
        assert auto.token_hit_rate >= lru.token_hit_rate - 0.015
    else:
        assert auto.alpha is not None and auto.alpha > 0
        assert auto.token_hit_rate > lru.token_hit_rate + 0.01


def test_the_live_build_path_makes_a_shadow_tuner_at_the_first_eviction() -> None:
    cfg = load_config(None, {"eviction": "marconi", "chunk_size": 256, "hash_block_size": 256,
                             "alignment": 1, "shadow_alphas": [0.0, 1.0],
                             "shadow_deterministic": True}, environ={})
    pol = assemble.policies(cfg).eviction
    assert isinstance(pol, MarconiEviction) and pol.tuner is None
    recs = GENERATORS["oneshot"](120, 3, 1, as_arrays=True)  # type: ignore[operator]
    with Simulator(cfg, GEO, Budget.pooled(int(0.02 * _footprint(recs))), eviction=pol) as sim:
        for r in recs:
            sim.step(r["input_tokens"], r["output_tokens"])
        tuner = pol.tuner
        assert isinstance(tuner, ShadowTuner) and tuner.started
        tuner.drain()
        # the requests before the first eviction were replayed into the twins
        assert tuner.steps == (len(recs) - tuner.skipped) * len(tuner.offered)
        assert tuner.skipped < len(recs) / 2  # the first requests came in one job
    assert pol.alpha in (0.0, 1.0)


def test_a_grown_grid_leaves_no_hashes_in_the_log() -> None:
    """A twin added when the grid grows catches up on the kept log, hashing each request
    (``TunerRequest.hasher``) as every twin does; the log still keeps tokens only after."""

    class Hashing(Scripted):
        def step(self, request: TunerRequest) -> float:
            request.hasher(4)
            return super().step(request)

    t = ShadowTuner(lambda c: Hashing(c, lambda c: min(c.alpha, 16.0), noise=0.5),
                    candidates((0.0, 1.0, 2.0), path_lru=False), start=Candidate(1.0),
                    max_alpha=32.0, background=False)
    t.start(0)
    _feed(t, 400)
    assert len(t.offered) > 3  # the grid grew: a new twin replayed the log
    assert all(not req._hashers for req in t._log)
