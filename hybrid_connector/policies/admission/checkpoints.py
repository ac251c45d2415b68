"""Admission policies: which recurrent-state checkpoints a request takes.

* ``MarconiAdmission``: a checkpoint where speculative insertion would create a new
  branch point (rounded down to the alignment; ``branch_point``), plus the last token of
  input+output.
* ``EveryBlockAdmission``: vLLM-style, a checkpoint at every ``block`` tokens.
* ``LastTokenAdmission``: only the final state.
"""

from __future__ import annotations

import numpy as np

from hybrid_connector.policies.base import AdmissionPolicy
from hybrid_connector.tree.radix import MatchResult, RadixTree


def align_down(pos: int, alignment: int) -> int:
    return pos - pos % alignment


def branch_point(match: MatchResult, query_len: int) -> int | None:
    """Where inserting the query creates a new branch: inside an edge (a split), or at a
    node boundary that is only a pass-through (one child, no state): such boundaries come
    from how saves were chunked, not from the token sets, so diverging there branches the
    same as diverging inside an edge would. A node that already branches, or a leaf the
    query extends, is no new branch."""
    if match.branch_point is not None:
        return match.branch_point
    node = match.node
    if (match.partial is None and 0 < match.length < query_len and node.parent is not None
            and len(node.children) == 1 and node.state is None):
        return match.length
    return None


class MarconiAdmission(AdmissionPolicy):
    name = "marconi"

    def state_positions(
        self, tree: RadixTree, match: MatchResult, tokens: np.ndarray, alignment: int
    ) -> tuple[int, ...]:
        at = branch_point(match, int(tokens.size))
        if at is None:
            return ()
        pos = align_down(at, alignment)
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
