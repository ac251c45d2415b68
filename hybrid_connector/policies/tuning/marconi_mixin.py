"""How ``MarconiEviction`` takes its setting from a tuner (a mixin: the policy's state is
its own; this is the part that talks to ``tuner.py`` / ``shadow_tuner.py``).

Contract: ``on_request`` feeds a finished request to the tuner (or keeps it, bounded, for a
tuner the factory builds at the first eviction, which is then primed with them);
``_adopt`` applies a decision (an alpha, or a ``Candidate``: alpha, refresh mode, score)
only when the policy is in auto mode; ``close`` closes the tuner (idempotent).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

import numpy as np

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.policies.tuning.base import Candidate, Tuner
from hybrid_connector.tree.radix import RadixTree

# (geometry, bytes per kind at the first eviction) -> the tuner
TunerFactory = Callable[[ModelGeometry, Mapping[ObjectKind, int]], Tuner]


class TunedSetting:
    """The tuner-facing half of ``MarconiEviction`` (see module docstring)."""

    auto: bool
    alpha: float
    refresh_path: bool
    score: str
    tuner: Tuner | None
    _tuner_factory: TunerFactory | None
    _prelog: deque[tuple[np.ndarray, int]]
    _requests: int
    alpha_history: list[tuple[int, float]]
    tree: RadixTree
    geometry: ModelGeometry

    def on_request(self, tokens: np.ndarray, prompt_len: int) -> None:
        """A request finished (``tokens`` = prompt + output). Feeds the alpha tuner."""
        self._requests += 1
        if self.tuner is not None:
            self.tuner.record(tokens, prompt_len)
            self._adopt()
        elif self.auto and self._tuner_factory is not None:
            self._prelog.append((np.asarray(tokens), int(prompt_len)))

    def _first_eviction(self) -> None:
        if not self.auto:
            return
        if self.tuner is None and self._tuner_factory is not None:
            snapshot = {k: self.tree.bytes[k] for k in ObjectKind}
            tuner = self._tuner_factory(self.geometry, snapshot)
            self._attach(tuner)
            self._tuner_factory = None
            prime = getattr(tuner, "prime", None)
            if prime is not None:
                prime(list(self._prelog))
                self._prelog.clear()
            while self._prelog:
                tuner.record(*self._prelog.popleft())
        if self.tuner is not None and not self.tuner.started:
            self.tuner.start(self._requests)

    def _attach(self, tuner: Tuner) -> None:
        """Use ``tuner``, starting from the candidate it starts from (if it names one)."""
        self.tuner = tuner
        cur = getattr(tuner, "current", None)
        if self.auto and isinstance(cur, Candidate):
            self.alpha, self.refresh_path, self.score = cur.alpha, cur.refresh_path, cur.score

    def _adopt(self) -> None:
        assert self.tuner is not None
        got = self.tuner.poll()
        if got is None or not self.auto:
            return
        if isinstance(got, Candidate):
            self.refresh_path, self.score = got.refresh_path, got.score
            got = got.alpha
        self.alpha = float(got)
        self.alpha_history.append((self._requests, self.alpha))

    def close(self) -> None:
        """Close the alpha tuner (joins its worker thread); idempotent."""
        if self.tuner is not None:
            self.tuner.close()
