"""Shadow tuning: one metadata-only twin cache per candidate, fed every live request.

Why not replay windows (``grid.py``): a window replayed from a cold cache scores mostly
its own warm-up, and neighbouring alphas then differ by noise (a choice below LRU on
traces where LRU is best). Here each candidate (a ``Candidate``: an alpha, a score, and
whether an access refreshes the whole path or its last node) owns a *shadow*: a size-only cache with the live
cache's budget, admission and accounting, which sees every request the live cache sees,
so it is never cold and at any time equals the fixed-candidate run up to now (the
"best fixed alpha in hindsight" is estimated online, not guessed from a short replay).

Contract:

* ``record(tokens, prompt_len)`` steps every shadow with the request (inline, or on the
  tuner's worker thread with ``background=True``), appending one score per candidate to a
  bounded history (the last ``horizon`` requests). Scores are the objective of that
  request in that shadow (hit tokens or FLOPs saved, the shadow factory decides).
* After ``start`` (the live cache's first eviction: before it every candidate ties) and
  every ``check_every`` requests, the candidate with the largest summed score over the
  history is compared with the current one on *paired* differences (same requests), in
  blocks of ``block`` requests (batch means, since hits are correlated in time). The tuner
  switches only when the summed gain exceeds ``z`` standard errors and ``min_gain`` of the
  current candidate's score (3 and 1% by default: the test is repeated every check and
  over every candidate, so a lower bar would let noise through). Falling back to LRU
  (the baseline the tuner must not lose to, and a direction that converges, see below)
  needs only ``z_fallback`` standard errors. From ``EARLY_MIN_BLOCKS`` blocks after
  ``start`` until ``early`` requests after it, the first switch away needs only
  ``z_early`` (1.5): a switch converges within a few reuses but forfeits every hit
  before it (blog agentic trace, 364 requests: LRU -> alpha 2 at request 50 / 100 / 150
  ends at 0.349 / 0.302 / 0.289 token hit rate, 0.356 from the start). Later switches
  need ``z``: switching again among sum-score alphas measured worse than staying (blog
  agentic, 626 requests: LRU -> 0.5 -> 2 at 70 / 110 ended at 0.423; 0.5 alone 0.461).
* It starts at ``start`` (LRU by default, so before any evidence it is LRU). The policy
  is path dependent, which decides what the candidates are: with Marconi's *sum* score
  and alpha > 0 the top-efficiency node is never the minimum, so a switch to it keeps
  whatever dead long node the old setting left (measured on the agentic trace: switching
  0 -> 4 after 100 of 385 requests kept 438k of the 494k hit tokens alpha 4 earns from
  the start; LRU earns 436k). The *product* score (``marconi.product_utility``) ages dead
  nodes out, so a late switch to it converges (LRU -> x16 after 50 / 100 of 232 requests:
  0.527 / 0.516 token hit rate against 0.534 from the start and 0.508 for LRU). Both
  families are offered by default (``policies.build.shadow_options``).
* Grid reach: when the largest alpha leads, a shadow at twice that alpha (up to
  ``max_alpha``) is added and caught up by replaying the kept request log through it.
* ``poll()`` hands each decision to the policy once; the tuner never touches the live
  cache. Memory: the request log and score history, bounded by ``horizon``; compute:
  one shadow step per candidate per request on the worker thread (``background``); when
  the worker is ``max_backlog`` requests behind, new requests are skipped by every shadow
  alike (counted in ``skipped``) rather than queued without bound. The worker holds the
  GIL while it steps, as the v1 window replays did.
* ``deterministic`` (with ``background``): the outcome never depends on the worker's
  speed. No request is skipped (at ``max_backlog`` the caller waits for the oldest step),
  and after every ``check_every``-th request fed (a decision point: the worker checks at
  the same counts) the caller waits for the worker to catch up before ``record`` returns,
  so ``poll`` hands over a decision at the same request in every run, exactly as the
  inline tuner would. The steps stay on the worker: the caller only blocks (no CPU time
  on its thread), for at most the ``check_every`` requests since the last barrier.
* ``cpu_share`` (with ``background`` and not ``deterministic``): the worker's CPU time is
  held to that share of the wall time since its first step (it sleeps off any excess
  after a step, releasing the interpreter lock). An engine thread in the same process
  (vLLM's engine core) then waits on the worker for at most that share of its time, plus
  one step, and a burst after idle time: the time it banks while idle is capped at
  ``MAX_CREDIT_S``. What the worker cannot keep up with is skipped (``max_backlog``).
  1.0: no bound.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hybrid_connector.policies.tuning.base import LRU, Candidate, TunerRequest

DEFAULT_ALPHAS: tuple[float, ...] = (0.0, 0.5, 2.0, 8.0, 32.0)
# blocks of evidence since ``start`` before ``z_early`` may apply: the standard error of
# 2-3 block sums is itself noisy (measured: noise alone crossed z 1.5 at 3 blocks)
EARLY_MIN_BLOCKS = 4
# ``cpu_share``: wall time the worker may bank while idle, spent later at full speed
MAX_CREDIT_S = 0.05


class Shadow(Protocol):
    """A twin cache for one candidate (built by the injected factory)."""

    def step(self, request: TunerRequest) -> float:
        """Serve ``request`` (lookup, then save as the live cache would); its score."""

    def close(self) -> None:
        """Release the twin (idempotent)."""


ShadowFactory = Callable[[Candidate], Shadow]


@dataclass
class ShadowRound:
    """One decision check (kept in ``ShadowTuner.history`` when it switched or extended)."""

    at_request: int
    window: int
    scores: dict[str, float] = field(default_factory=dict)
    chosen: Candidate = LRU
    gain: float = 0.0
    noise: float = 0.0


def candidates(alphas: Sequence[float], path_lru: bool = True, score: str = "sum") -> tuple[Candidate, ...]:
    """LRU (when ``path_lru``) plus last-node Marconi at each alpha with ``score``,
    deduplicated (alpha 0 is recency alone whatever the score)."""
    out = [LRU] if path_lru else []
    out += [Candidate(float(a), False, score if a > 0 else "sum") for a in sorted(set(alphas))]
    return tuple(dict.fromkeys(out))


class ShadowTuner:
    """Chooses among candidates by their shadows' paired scores (see module docstring)."""

    def __init__(
        self,
        factory: ShadowFactory,
        offered: Sequence[Candidate] = candidates(DEFAULT_ALPHAS),
        start: Candidate = LRU,
        z: float = 3.0,
        z_fallback: float = 1.0,
        min_gain: float = 0.01,
        block: int = 10,
        check_every: int = 10,
        horizon: int = 4000,
        max_alpha: float = 64.0,
        background: bool = True,
        max_backlog: int = 64,
        z_early: float = 1.5,
        early: int = 200,
        deterministic: bool = False,
        cpu_share: float = 1.0,
    ) -> None:
        if not offered or any(c.alpha < 0 for c in offered):
            raise ValueError(f"candidates must be non-empty with alpha >= 0, got {offered}")
        if (z < 0 or z_fallback < 0 or z_early < 0 or early < 0 or min_gain < 0 or block < 2
                or check_every < 1 or horizon < 2 * block):
            raise ValueError("z, z_early, early, min_gain >= 0, block >= 2, check_every >= 1, "
                             "horizon >= 2*block")
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share must be in (0, 1], got {cpu_share}")
        self.factory = factory
        self.offered: list[Candidate] = list(dict.fromkeys(offered))
        self.z, self.z_fallback = float(z), float(z_fallback)
        self.z_early, self.early = float(z_early), int(early)
        self._started_at: int | None = None  # requests seen by the shadows at ``start``
        self.min_gain, self.block = float(min_gain), int(block)
        self.check_every, self.horizon, self.max_alpha = int(check_every), int(horizon), max_alpha
        self.background = background
        self.max_backlog = max_backlog
        self.deterministic = deterministic
        self.cpu_share = float(cpu_share)
        self.slept_s = 0.0  # time the worker slept to keep to ``cpu_share``
        self._clock0: tuple[float, float] | None = None  # (wall, worker CPU) at its first step
        self._fed = 0  # requests handed to the shadows (primed ones included)
        self.skipped = 0  # requests no shadow saw (the worker was ``max_backlog`` behind)
        if start not in self.offered:
            raise ValueError(f"start {start} is not among the candidates {self.offered}")
        self.current = start
        self.started = False
        self.history: list[ShadowRound] = []
        self.steps = 0  # shadow steps run (cost counter)
        self._shadows: list[Shadow] | None = None
        self._log: deque[TunerRequest] = deque(maxlen=horizon)
        self._scores: deque[list[float]] = deque(maxlen=horizon)
        self._seen = 0
        self._decided: Candidate | None = None
        self._lock = threading.Lock()  # the decision handed to ``poll``
        self._pool: ThreadPoolExecutor | None = None
        # the worker's queued steps, oldest first: one worker runs them in order, so the
        # done ones are always a prefix (dropped from the front, not by a scan of all)
        self._pending: deque[Future[None]] = deque()

    # ---------------------------------------------------------------- inputs
    def start(self, requests_seen: int) -> None:
        """The live cache evicted for the first time (decisions may begin)."""
        self.started = True

    def record(self, tokens: np.ndarray, prompt_len: int) -> None:
        """Feed one finished request to every shadow (may run a decision check)."""
        if not 0 < prompt_len <= len(tokens):
            raise ValueError(f"prompt_len {prompt_len} outside (0, {len(tokens)}]")
        req = TunerRequest(np.asarray(tokens, dtype=np.int64), int(prompt_len))
        while self._pending and self._pending[0].done():
            self._pending.popleft()
        if self.background and len(self._pending) >= self.max_backlog:
            if not self.deterministic:
                self.skipped += 1  # every shadow skips it alike, so the pairing stays exact
                return
            self._pending.popleft().result()  # wait (off this thread's CPU clock), never skip
        self._fed += 1
        self._run(self._step, req, self.started)
        if self.deterministic and self._fed % self.check_every == 0:
            self.drain()  # the barrier: a decision due at this count is in ``poll`` now

    def prime(self, requests: Sequence[tuple[np.ndarray, int]]) -> None:
        """Feed requests the live cache served before this tuner existed, as one job (not
        subject to ``max_backlog``): the twins then start where the live cache stands."""
        reqs = [TunerRequest(np.asarray(t, dtype=np.int64), int(p)) for t, p in requests]
        self._fed += len(reqs)

        def run() -> None:
            for r in reqs:
                self._step(r, False)

        self._run(run)

    def _run(self, fn: Callable[..., None], *args: object) -> None:
        """``fn(*args)`` inline, or queued on the worker thread when backgrounded."""
        if not self.background:
            fn(*args)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="shadow-tuner")
        self._pending.append(self._pool.submit(fn, *args))

    def poll(self) -> Candidate | None:
        """The candidate of a switch decided since the last poll, else ``None``."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()  # a shadow's exception surfaces on this thread
        with self._lock:
            got, self._decided = self._decided, None
        return got

    # ---------------------------------------------------------------- worker
    def _step(self, req: TunerRequest, started: bool) -> None:
        if not self.background or self.deterministic or self.cpu_share >= 1:
            self._shadow_step(req, started)  # no ``cpu_share`` bound
            return
        if self._clock0 is None:
            self._clock0 = (time.perf_counter(), time.thread_time())
        self._shadow_step(req, started)
        wall0, cpu0 = self._clock0
        busy, elapsed = time.thread_time() - cpu0, time.perf_counter() - wall0
        owed = busy / self.cpu_share - elapsed
        if owed > 0:
            time.sleep(owed)  # releases the interpreter lock to the engine's thread
            self.slept_s += owed
        elif owed < -MAX_CREDIT_S:  # idle time banks no burst beyond MAX_CREDIT_S
            self._clock0 = (time.perf_counter() - MAX_CREDIT_S * (1 - self.cpu_share),
                            time.thread_time())

    def _shadow_step(self, req: TunerRequest, started: bool) -> None:
        if self._shadows is None:
            self._shadows = [self.factory(c) for c in self.offered]
        self._log.append(req)
        self._scores.append([s.step(req) for s in self._shadows])
        req.forget_hashes()  # ~3.6 B a token while logged; a catch-up replay hashes again
        self.steps += len(self._shadows)
        self._seen += 1
        if started and self._started_at is None:
            self._started_at = self._seen - 1  # this request is the first evidence
        if started and self._seen % self.check_every == 0:
            self._check()

    def _check(self) -> None:
        w = np.asarray(self._scores, dtype=np.float64)
        if len(w) < 2 * self.block:
            return
        sums = w.sum(axis=0)
        cur = self.offered.index(self.current)
        best = max(range(len(self.offered)), key=lambda i: (sums[i], i == cur, -i))
        self._maybe_extend(w, sums)
        if best == cur:
            return
        assert self._started_at is not None
        since = self._seen - self._started_at
        # the low bar only for the first move away, and only on EARLY_MIN_BLOCKS blocks
        early = EARLY_MIN_BLOCKS * self.block <= since < self.early and not self.history
        z = self.z_fallback if self.offered[best] == LRU else self.z_early if early else self.z
        gain, noise = self._paired(w[:, best] - w[:, cur], z)
        if gain > noise and gain > self.min_gain * max(sums[cur], 1e-12):
            chosen = self.offered[best]
            self.history.append(ShadowRound(
                self._seen, len(w), {c.label: float(s) for c, s in zip(self.offered, sums, strict=False)},
                chosen, gain, noise))
            with self._lock:
                self.current = chosen
                self._decided = chosen

    def _paired(self, d: np.ndarray, z: float) -> tuple[float, float]:
        """(summed gain, ``z`` standard errors of it) from block sums of ``d``."""
        nb = len(d) // self.block
        blocks = d[len(d) - nb * self.block:].reshape(nb, self.block).sum(axis=1)
        se = float(blocks.std(ddof=1)) * math.sqrt(nb) if nb > 1 else math.inf
        return float(d.sum()), z * se

    def _maybe_extend(self, w: np.ndarray, sums: np.ndarray) -> None:
        """Add a shadow at twice the largest alpha while that alpha significantly leads
        the next smaller one (the score still rises at the grid's edge)."""
        lead = self.offered[int(np.argmax(sums))]
        # the leader's own score family (alpha 0 is recency in every family)
        plain = sorted((c.alpha, i) for i, c in enumerate(self.offered) if not c.refresh_path
                       and (c.score == lead.score or c.alpha == 0))
        if (lead.refresh_path or len(plain) < 2 or plain[-1][0] <= 0
                or 2 * plain[-1][0] > self.max_alpha):
            return
        top, nxt = plain[-1][1], plain[-2][1]
        if sums[top] < max(sums):
            return
        gain, noise = self._paired(w[:, top] - w[:, nxt], self.z)
        if gain <= noise:
            return
        top_c = self.offered[top]
        new = Candidate(2 * plain[-1][0], False, top_c.score)
        assert self._shadows is not None
        shadow = self.factory(new)
        column = [shadow.step(r) for r in self._log]  # catch up on the kept log
        for r in self._log:
            r.forget_hashes()
        self.steps += len(column)
        self.offered.append(new)
        self._shadows.append(shadow)
        for row, s in zip(self._scores, column, strict=True):
            row.append(s)

    def drain(self) -> None:
        """Wait until the worker has stepped every queued request (tests, benchmarks, the
        deterministic barrier)."""
        for f in list(self._pending):
            f.result()

    def close(self) -> None:
        """Stop the worker (the running step finishes, queued ones are dropped) and close
        every shadow. Idempotent; a closed tuner steps inline if fed again."""
        self.background = False
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending = deque(f for f in self._pending if not f.cancelled())
        for s in self._shadows or []:
            s.close()
