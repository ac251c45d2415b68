"""Distribution-aware checkpoint placement as an admission hook.

``PlacementAdmission`` wraps another admission policy (Marconi's) and adds up to ``slots``
checkpoint positions per prompt, chosen by ``placement.solve_dp`` over the overlap depths
observed for the prompt's shared prefix:

* A prefix is identified by its first ``key_tokens`` tokens (a request shorter than that is
  left to the inner policy). Each later request with that key contributes its radix match
  length (its overlap depth with what the cache holds) to the key's ``DepthHistogram``: an
  exponentially weighted histogram of depths in ``bin``-token bins (weights decay by
  ``decay`` per observation, so placement follows drift).
* Positions come from the DP (replanned every ``replan_every`` observations), converted to
  tokens, snapped down to the engine alignment, and kept only inside the prompt. With no
  data yet for a key, ``cold_start`` decides: balanced spacing over the prompt, or nothing.
* Trackers are kept for at most ``max_keys`` prefixes (least recently seen dropped).
* ``tree=True``: observations are projected onto the path of the prompt being planned
  (``placement_tree.TreeDepths``), so depths seen down one branch do not place
  checkpoints on another.

The cache asks ``state_positions`` from ``plan_saves`` (no side effects on the cache);
recording the depth is this policy's own bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from hybrid_connector.policies.admission.checkpoints import align_down
from hybrid_connector.policies.admission.placement import balanced, solve_dp
from hybrid_connector.policies.admission.placement_tree import TreeDepths, bin_chain
from hybrid_connector.policies.base import AdmissionPolicy
from hybrid_connector.tree.radix import MatchResult, RadixTree


class DepthHistogram:
    """Exponentially weighted histogram of overlap depths (in bins) with a cached plan."""

    def __init__(self, bin_tokens: int, decay: float, replan_every: int = 10) -> None:
        if bin_tokens <= 0 or not 0 < decay <= 1 or replan_every <= 0:
            raise ValueError("bin_tokens > 0, 0 < decay <= 1 and replan_every > 0 required")
        self.bin = bin_tokens
        self.decay = decay
        self.replan_every = replan_every
        self.weights = np.zeros(16, dtype=np.float64)
        self.observations = 0
        self._plan: dict[tuple[int, int], list[int]] = {}
        self._since = 0

    def observe(self, depth_tokens: int, chain: np.ndarray | None = None) -> None:
        """Add one overlap depth (tokens); older observations decay by ``decay``. ``chain``
        (the request's path, ``TreeDepths``' interface) is not used: one prefix."""
        if depth_tokens < 0:
            raise ValueError(f"depth must be >= 0, got {depth_tokens}")
        b = depth_tokens // self.bin
        if b >= self.weights.size:
            grown = np.zeros(max(b + 1, 2 * self.weights.size))
            grown[: self.weights.size] = self.weights
            self.weights = grown
        if self.decay < 1:
            self.weights *= self.decay
        self.weights[b] += 1.0
        self.observations += 1
        self._since += 1
        if self._since >= self.replan_every:
            self._plan.clear()
            self._since = 0

    def plan(self, n_bins: int, slots: int, chain: np.ndarray | None = None) -> list[int]:
        """Checkpoint bins for a prefix of ``n_bins`` bins (balanced when there is no data).
        Depths beyond the prefix are clipped to its end (a checkpoint there serves them).
        ``chain`` is not used (see ``observe``)."""
        key = (n_bins, slots)
        got = self._plan.get(key)
        if got is None:
            w = self.weights[: n_bins + 1].copy()
            if self.weights.size > n_bins + 1:
                w[-1] += float(self.weights[n_bins + 1 :].sum())
            got = solve_dp(w, slots)[1] if w.sum() > 0 else balanced(n_bins, slots)
            self._plan[key] = got
        return got


class PlacementAdmission(AdmissionPolicy):
    """Inner admission's positions plus DP-placed checkpoints (see module docstring)."""

    name = "placement"

    def __init__(
        self,
        inner: AdmissionPolicy,
        slots: int,
        bin_tokens: int = 64,
        decay: float = 0.99,
        key_tokens: int | None = None,
        cold_start: bool = False,
        min_prompt: int = 0,
        replan_every: int = 10,
        max_keys: int = 4096,
        tree: bool = False,
    ) -> None:
        if slots < 0:
            raise ValueError(f"slots must be >= 0, got {slots}")
        self.inner = inner
        self.slots = slots
        self.bin = bin_tokens
        self.decay = decay
        self.key_tokens = key_tokens or bin_tokens
        self.cold_start = cold_start
        self.min_prompt = max(min_prompt, 2 * bin_tokens)
        self.replan_every = replan_every
        self.max_keys = max_keys
        self.tree = tree
        self.trackers: OrderedDict[bytes, DepthHistogram | TreeDepths] = OrderedDict()

    def state_positions(
        self, tree: RadixTree, match: MatchResult, tokens: np.ndarray, alignment: int
    ) -> tuple[int, ...]:
        base = self.inner.state_positions(tree, match, tokens, alignment)
        n = int(tokens.size)
        if self.slots == 0 or n < self.min_prompt or n < self.key_tokens:
            return base
        key = tokens[: self.key_tokens].tobytes()
        hist = self.trackers.get(key)
        chain = bin_chain(tokens, self.bin) if self.tree else None
        if hist is None:
            hist = self.trackers[key] = (TreeDepths(self.bin, self.decay) if self.tree else
                                         DepthHistogram(self.bin, self.decay, self.replan_every))
            if len(self.trackers) > self.max_keys:
                self.trackers.popitem(last=False)
            if not self.cold_start:
                return base
        else:
            self.trackers.move_to_end(key)
            hist.observe(match.length, chain)
        bins = hist.plan(n // self.bin, self.slots, chain)
        extra = [align_down(b * self.bin, alignment) for b in bins]
        return tuple(sorted(set(base) | {p for p in extra if 0 < p < n}))

    def admit_final(self, num_tokens: int) -> bool:
        return self.inner.admit_final(num_tokens)
