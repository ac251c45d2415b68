"""Admission policies: which recurrent-state checkpoints a request takes.

* ``MarconiAdmission``: a checkpoint where speculative insertion would create a new
  branch point (rounded down to the alignment), plus the last token of input+output.
* ``EveryBlockAdmission``: vLLM-style, a checkpoint at every ``block`` tokens.
* ``LastTokenAdmission``: only the final state.
"""

from __future__ import annotations

import numpy as np

from hybrid_connector.policies.base import AdmissionPolicy
from hybrid_connector.radix import MatchResult, RadixTree


def align_down(pos: int, alignment: int) -> int:
    return pos - pos % alignment


class MarconiAdmission(AdmissionPolicy):
    name = "marconi"

    def state_positions(
        self, tree: RadixTree, match: MatchResult, tokens: np.ndarray, alignment: int
    ) -> tuple[int, ...]:
        if match.branch_point is None:
            return ()
        pos = align_down(match.branch_point, alignment)
        return (pos,) if 0 < pos < tokens.size else ()


class EveryBlockAdmission(AdmissionPolicy):
    name = "every_block"

    def __init__(self, block: int) -> None:
        if block <= 0:
            raise ValueError(f"block must be positive, got {block}")
        self.block = block

    def state_positions(
        self, tree: RadixTree, match: MatchResult, tokens: np.ndarray, alignment: int
    ) -> tuple[int, ...]:
        step = max(self.block, alignment)
        step = step + (-step) % alignment  # a multiple of both would be exact; keep aligned
        return tuple(range(step, int(tokens.size), step))


class LastTokenAdmission(AdmissionPolicy):
    name = "last_token"

    def state_positions(
        self, tree: RadixTree, match: MatchResult, tokens: np.ndarray, alignment: int
    ) -> tuple[int, ...]:
        return ()
