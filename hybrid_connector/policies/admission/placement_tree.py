"""Sparse placement over a prefix tree, not only one prefix (placement_tree: true).

``PlacementAdmission`` keeps one depth histogram per shared prefix (its first tokens) and
places checkpoints on the prompt at hand with it. Over a tree that is wrong past a branch:
a request that went down branch B, observed at depth t beyond the branch point b, asks for
a checkpoint at t on *B's* path, and the plan puts one at t on branch A's path too, where
no request will ever stop.

``TreeDepths`` keeps the recent observations themselves (depth, and the request's chain of
per-bin token hashes) and projects each onto the path of the prompt being planned: an
observation that agrees with the prompt for its first a bins counts at depth min(t, a),
the deepest point of *this* path that would serve it. The single-prefix DP (``solve_dp``)
then runs on the projected histogram, so every branch gets checkpoints where its own
traffic stops, and a trunk shared by all branches gets those its whole subtree wants.
Weights decay with age (``decay`` per observation), like ``DepthHistogram``.

Cost: O(window x bins) numpy comparisons per plan (no plan cache: plans are per path),
O(prompt) hashing per observation; memory: ``window`` chains of per-bin hashes per prefix.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from hybrid_connector.policies.admission.placement import balanced, solve_dp


def bin_chain(tokens: np.ndarray, bin_tokens: int) -> np.ndarray:
    """Per-bin chained hashes of ``tokens`` (element i identifies tokens[: (i+1)*bin])."""
    n = int(tokens.size) // bin_tokens
    out = np.empty(n, dtype=np.uint64)
    h = 0
    data = np.ascontiguousarray(tokens[: n * bin_tokens], dtype=np.int64)
    for i in range(n):
        h = hash((h, data[i * bin_tokens:(i + 1) * bin_tokens].tobytes())) & 0xFFFFFFFFFFFFFFFF
        out[i] = h
    return out


class TreeDepths:
    """Recent overlap depths of one shared prefix, each with its path (see module docstring)."""

    def __init__(self, bin_tokens: int, decay: float, window: int = 256) -> None:
        if bin_tokens <= 0 or not 0 < decay <= 1 or window < 1:
            raise ValueError("bin_tokens > 0, 0 < decay <= 1 and window >= 1 required")
        self.bin, self.decay = bin_tokens, decay
        self.obs: deque[tuple[int, np.ndarray]] = deque(maxlen=window)
        self.observations = 0

    def observe(self, depth_tokens: int, chain: np.ndarray | None = None) -> None:
        """One request of this prefix matched ``depth_tokens`` tokens; ``chain`` is its
        ``bin_chain`` (required: ValueError without it)."""
        if chain is None:
            raise ValueError("TreeDepths needs the request's bin_chain")
        if depth_tokens < 0:
            raise ValueError(f"depth must be >= 0, got {depth_tokens}")
        self.obs.append((depth_tokens // self.bin, chain))
        self.observations += 1

    def weights(self, chain: np.ndarray, n_bins: int) -> np.ndarray:
        """The depth histogram projected onto the path ``chain`` (bins 0..n_bins)."""
        w = np.zeros(n_bins + 1, dtype=np.float64)
        age = len(self.obs) - 1
        for i, (depth, other) in enumerate(self.obs):
            m = min(len(chain), len(other))
            diff = np.flatnonzero(chain[:m] != other[:m])
            agree = int(diff[0]) if diff.size else m
            w[min(depth, agree, n_bins)] += self.decay ** (age - i)
        return w

    def plan(self, n_bins: int, slots: int, chain: np.ndarray | None = None) -> list[int]:
        """Checkpoint bins for the path ``chain`` of ``n_bins`` bins (the same interface as
        ``DepthHistogram.plan``; ValueError without ``chain``)."""
        if chain is None:
            raise ValueError("TreeDepths needs the prompt's bin_chain")
        w = self.weights(chain, n_bins)
        return solve_dp(w, slots)[1] if w.sum() > 0 else balanced(n_bins, slots)
