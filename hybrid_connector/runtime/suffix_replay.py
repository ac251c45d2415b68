"""Suffix replay's engine-neutral half: the quality measure and the gate that admits a replay.

Rebuilding recurrent state from anchors needs the model's own layers, so it lives with the
engine (``integrations.hf_replay`` for transformers). What stays here is what every engine
shares: replay is approximate, so every hit built that way is labelled ``exact=False``, and
:class:`ReplayGate` accepts a replay only when a calibration measured, for that many anchor
tokens, a next-token KL at most ``config.replay_max_kl`` and a top-1 agreement at least
``config.replay_min_top1`` against full prefill; everything else falls back to an exact
hit or a miss. This module imports no engine and nothing of ``integrations``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import torch


def next_token_kl(ref_logits: torch.Tensor, test_logits: torch.Tensor) -> torch.Tensor:
    """KL(ref || test) of the softmax distributions, per row (last dim is the vocab)."""
    lp = torch.log_softmax(ref_logits.double(), dim=-1)
    lq = torch.log_softmax(test_logits.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(-1)


@dataclass(frozen=True)
class ReplayQuality:
    """Replay vs full prefill at one budget: ``k`` anchors replayed; mean and max KL of the
    next-token distributions over the suffix positions, top-1 agreement there, and the
    fraction of a greedy continuation's tokens that match (up to the first divergence)."""

    k: int
    kl_mean: float
    kl_max: float
    top1: float
    continuation: float
    continuation_len: int

    def passes(self, max_kl: float, min_top1: float) -> bool:
        return self.kl_mean <= max_kl and self.top1 >= min_top1 and self.continuation >= min_top1


@dataclass
class ReplayGate:
    """Accepts a replay of k anchors iff a calibration at some k' <= k passed (quality grows
    with k) and none at k'' >= k failed. Uncalibrated: rejects everything (safe default).
    Mutable: :meth:`record` adds measurements (thread-unsafe, calibrate before serving)."""

    max_kl: float
    min_top1: float
    measured: dict[int, list[ReplayQuality]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Any) -> ReplayGate:
        return cls(float(config.replay_max_kl), float(config.replay_min_top1))

    def record(self, q: ReplayQuality) -> None:
        self.measured.setdefault(q.k, []).append(q)

    def passed_at(self, k: int) -> bool | None:
        """Did every calibration at exactly k pass? None when k was not measured."""
        qs = self.measured.get(k)
        if not qs:
            return None
        return all(q.passes(self.max_kl, self.min_top1) for q in qs)

    def admits(self, k: int) -> bool:
        ks = sorted(self.measured)
        below = [kk for kk in ks[: bisect.bisect_right(ks, k)] if self.passed_at(kk)]
        if not below:
            return False
        lo = max(below)
        return all(self.passed_at(kk) for kk in ks if lo <= kk <= k)
