"""Alpha auto-tuning for Marconi eviction (grid search over replays of a bootstrap window).

Protocol (Marconi's ``config_tuner.py``, made periodic):

1. The policy runs with alpha 0 (pure recency, i.e. LRU) until its first eviction; it then
   calls ``start(R)`` with R = requests seen so far.
2. Once ``bootstrap_multiplier * R`` requests have been recorded, the recorded window is
   replayed from an empty cache once per alpha in ``grid`` by the injected ``replayer``,
   off the request path: on a worker thread (``background=True``) or inline
   (``background=False``, deterministic, what the simulator uses). The objective is summed
   over the last ``eval_last`` requests of the window (all of it when shorter, the second
   half when the window is under ``2 * eval_last``, so the replay's own cold start does not
   decide). The best alpha wins; on a tie the current alpha is kept, else the smallest.
3. Every ``retune_interval`` requests after that (0: never) the most recent window of the
   same length is replayed again, so alpha follows workload drift.

``poll()`` hands a finished result to the policy exactly once. The tuner never touches the
live cache; its memory is the request log (token arrays), bounded by the window length.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from hybrid_connector.policies.tuning.base import TunerRequest

__all__ = ["DEFAULT_GRID", "AlphaTuner", "Replayer", "TunerRequest", "TuningRound"]

DEFAULT_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(21))


# (window, alpha, eval_from) -> objective summed over window[eval_from:]; larger is better.
Replayer = Callable[[Sequence[TunerRequest], float, int], float]


@dataclass
class TuningRound:
    """What one grid search saw and chose (kept in ``AlphaTuner.history``)."""

    at_request: int
    window: int
    scores: dict[float, float] = field(default_factory=dict)
    chosen: float = 0.0


class AlphaTuner:
    """Grid search of alpha over replays of recent requests (see module docstring)."""

    def __init__(
        self,
        replayer: Replayer,
        grid: Sequence[float] = DEFAULT_GRID,
        bootstrap_multiplier: int = 5,
        retune_interval: int = 500,
        eval_last: int = 500,
        background: bool = True,
        min_window: int = 100,
    ) -> None:
        if not grid or any(a < 0 for a in grid):
            raise ValueError(f"alpha grid must be non-empty and >= 0, got {grid}")
        if bootstrap_multiplier < 1 or retune_interval < 0 or eval_last < 1:
            raise ValueError("bootstrap_multiplier >= 1, retune_interval >= 0, eval_last >= 1")
        self.replayer = replayer
        self.grid = tuple(sorted(set(float(a) for a in grid)))
        self.multiplier = bootstrap_multiplier
        self.retune_interval = retune_interval
        self.eval_last = eval_last
        self.background = background
        self.min_window = min_window
        self.started = False
        self.current = 0.0
        self.history: list[TuningRound] = []
        self._log: deque[TunerRequest] = deque()
        self._window = 0
        self._seen = 0
        self._next_at = math.inf
        self._future: Future[TuningRound] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- inputs
    def start(self, requests_seen: int) -> None:
        """The policy's first eviction happened after ``requests_seen`` requests."""
        if self.started:
            return
        self.started = True
        self._window = max(self.min_window, self.multiplier * max(1, requests_seen))
        self._next_at = self._window

    def record(self, tokens: np.ndarray, prompt_len: int) -> None:
        """Log one finished request; launches a tuning round when one is due."""
        if not 0 < prompt_len <= len(tokens):
            raise ValueError(f"prompt_len {prompt_len} outside (0, {len(tokens)}]")
        self._log.append(TunerRequest(np.asarray(tokens, dtype=np.int64), int(prompt_len)))
        self._seen += 1
        if self.started:
            while len(self._log) > self._window:
                self._log.popleft()
        if self.started and self._future is None and self._seen >= self._next_at:
            self._launch()

    def poll(self) -> float | None:
        """The alpha of a round that finished since the last poll, else ``None``."""
        fut = self._future
        if fut is None or not fut.done():
            return None
        self._future = None
        rnd = fut.result()  # a replayer exception surfaces here, on the caller's thread
        self.history.append(rnd)
        self.current = rnd.chosen
        self._next_at = self._seen + self.retune_interval if self.retune_interval else math.inf
        return rnd.chosen

    # -------------------------------------------------------------- search
    def _launch(self) -> None:
        window = list(self._log)[-self._window :]
        at = self._seen
        if self.background:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="alpha-tuner")
            self._future = self._pool.submit(self.search, window, at)
        else:
            fut: Future[TuningRound] = Future()
            fut.set_result(self.search(window, at))
            self._future = fut

    def search(self, window: Sequence[TunerRequest], at_request: int = 0) -> TuningRound:
        """Replay ``window`` once per alpha in the grid; return the round (pure)."""
        n = len(window)
        span = min(self.eval_last, n) if n >= 2 * self.eval_last else max(1, n // 2)
        eval_from = n - span
        rnd = TuningRound(at_request, n)
        for a in self.grid:
            rnd.scores[a] = float(self.replayer(window, a, eval_from))
        for req in window:  # hashed once for every alpha; the log keeps the tokens only
            req.forget_hashes()
        best = max(rnd.scores.values())
        if rnd.scores.get(self.current, -math.inf) >= best:
            rnd.chosen = self.current
        else:
            rnd.chosen = min(a for a, s in rnd.scores.items() if s >= best)
        return rnd

    def close(self) -> None:
        """Stop the worker thread (a running round finishes first and ``poll`` still hands
        it over). Idempotent; a closed tuner never starts another thread: a round still
        due afterwards runs inline."""
        self.background = False
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
