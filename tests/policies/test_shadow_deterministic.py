"""Deterministic shadow tuning: the decisions (which candidate, at which request) do not
depend on how fast the background worker is. The worker is slowed with a condition
variable (never a sleep): each twin step waits until the caller has fed ``lag`` more
requests, or until the caller is at a barrier (where it waits for the worker)."""

from __future__ import annotations

import threading

import numpy as np

from hybrid_connector.policies.tuning.base import Candidate, TunerRequest
from hybrid_connector.policies.tuning.shadow import ShadowTuner, candidates

CHECK = 10  # the tuner's check_every (the barrier's period)
N = 600


class Gate:
    """How many requests the caller has fed; twin step ``r`` (1-based) waits for
    ``min(r + lag, r's barrier, N)`` of them, so the worker runs ``lag`` behind when it can."""

    def __init__(self, lag: int) -> None:
        self.lag, self.fed = lag, 0
        self.cond = threading.Condition()

    def feed(self) -> None:
        with self.cond:
            self.fed += 1
            self.cond.notify_all()

    def wait(self, r: int) -> None:
        barrier = -(-r // CHECK) * CHECK
        with self.cond:
            self.cond.wait_for(lambda: self.fed >= min(r + self.lag, barrier, N))


class Twin:
    """Scores ``mean + noise`` from a generator seeded per candidate (the same sequence in
    every run); alpha 2 is better on average, so the tuner switches to it at some point."""

    def __init__(self, cand: Candidate, gate: Gate | None) -> None:
        self.cand, self.gate, self.steps = cand, gate, 0
        self.rng = np.random.default_rng(int(cand.alpha * 1000) + cand.refresh_path)

    def step(self, request: TunerRequest) -> float:
        self.steps += 1
        if self.gate is not None:
            self.gate.wait(self.steps)
        return 10.0 + 0.4 * (self.cand.alpha == 2.0) + 3.0 * float(self.rng.standard_normal())

    def close(self) -> None:
        pass


def _run(background: bool, lag: int | None) -> tuple[list[tuple[int, str]], int]:
    gate = Gate(lag) if lag is not None else None
    t = ShadowTuner(lambda c: Twin(c, gate), candidates((0.0, 0.5, 2.0)), background=background,
                    deterministic=True, check_every=CHECK, z_early=3.0)
    decisions = []
    for i in range(1, N + 1):
        if i == 5:
            t.start(i)
        if gate is not None:
            gate.feed()
        t.record(np.arange(3, 20), 10)
        got = t.poll()
        if got is not None:
            decisions.append((i, got.label))
    t.close()
    return decisions, t.skipped


def test_decisions_do_not_depend_on_the_workers_speed() -> None:
    inline, _ = _run(background=False, lag=None)
    assert inline, "the scripted twins must make the tuner switch at least once"
    fast, skipped_fast = _run(background=True, lag=None)
    slow, skipped_slow = _run(background=True, lag=CHECK - 1)
    again, _ = _run(background=True, lag=CHECK - 1)
    assert fast == slow == again == inline
    assert skipped_fast == skipped_slow == 0


def test_a_full_backlog_waits_instead_of_skipping() -> None:
    gate = threading.Event()

    class Held(Twin):
        def step(self, request: TunerRequest) -> float:
            gate.wait()
            return super().step(request)

    t = ShadowTuner(lambda c: Held(c, None), candidates((1.0,)), background=True,
                    deterministic=True, max_backlog=2, check_every=1000)
    t.record(np.arange(3, 20), 10)
    t.record(np.arange(3, 20), 10)
    done = threading.Event()

    def third() -> None:
        t.record(np.arange(3, 20), 10)  # blocks on the oldest step
        done.set()

    th = threading.Thread(target=third)
    th.start()
    assert not done.is_set()
    gate.set()
    th.join()
    t.drain()
    assert t.skipped == 0 and t.steps == 3 * len(t.offered)
    t.close()
