"""What a radix node is worth to Marconi's eviction: FLOPs a hit on it saves per byte.

Two accountings share one interface (``efficiency(node_depth, parent_depth, has_state,
is_leaf)`` and ``hit_flops(hit_tokens)``):

* ``CorrectedAccounting`` (the default): FLOPs saved are the model's per-family FLOPs over the
  node's own edge ``[parent_depth, node_depth)`` (``ModelGeometry.flops_saved``, attention
  counted over its causal context); bytes are what evicting the node frees: its
  checkpoint (GQA-aware ``state_bytes``) plus, for a leaf, the KV of its own edge
  (``kv_bytes_per_token`` per token, node-local). A single-child node only frees its state.
* ``ReferenceAccounting``: the Marconi reference simulator's formulas verbatim (``ref_*`` in
  ``model.py``): path-level KV bytes ``KV(l_total)`` charged to every node, the MLP term
  that subtracts ``attn(l_parent)`` (its bug), MHA-sized KV, every node charged one state.

Both are pure functions of their arguments, so results may be cached per node as long as
the arguments (the node's structural key) are unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from hybrid_connector.geometry.model import (
    ModelGeometry,
    ref_attn_flops,
    ref_mamba_flops,
    ref_mlp_flops,
    ref_node_efficiency,
)
from hybrid_connector.geometry.presets import marconi_ref_params


class Accounting(ABC):
    """FLOPs-per-byte value of radix nodes and FLOPs saved by hits."""

    name = "base"

    @abstractmethod
    def efficiency(self, node_depth: int, parent_depth: int, has_state: bool, is_leaf: bool) -> float:
        """FLOPs a hit on a node ending at ``node_depth`` saves over a hit on its parent,
        divided by the bytes charged to the node. Raises ValueError for an empty edge."""

    @abstractmethod
    def hit_flops(self, hit_tokens: int) -> float:
        """FLOPs a hit of ``hit_tokens`` tokens saves (the tuner's ``flops`` objective)."""


class CorrectedAccounting(Accounting):
    """GQA-aware, node-local bytes; per-family FLOPs (see module docstring)."""

    name = "corrected"

    def __init__(self, geometry: ModelGeometry) -> None:
        self.geometry = geometry
        self.kv_per_token = geometry.kv_bytes_per_token()
        self.state_bytes = geometry.state_bytes()
        self._memo: dict[tuple[int, int], float] = {}

    def savings(self, node_depth: int, parent_depth: int) -> float:
        """FLOPs of the edge ``[parent_depth, node_depth)`` given the parent's prefix."""
        if node_depth <= parent_depth:
            raise ValueError(f"empty edge [{parent_depth}, {node_depth})")
        key = (node_depth, parent_depth)
        got = self._memo.get(key)
        if got is None:
            if len(self._memo) >= 1 << 17:  # bounded: eviction asks the same edges repeatedly
                self._memo.clear()
            got = self._memo[key] = self.geometry.flops_saved(node_depth - parent_depth, parent_depth).total
        return got

    def node_bytes(self, node_depth: int, parent_depth: int, has_state: bool, is_leaf: bool) -> int:
        """Bytes evicting the node frees: its state, plus its edge's KV for a leaf."""
        kv = (node_depth - parent_depth) * self.kv_per_token if is_leaf else 0
        return kv + (self.state_bytes if has_state else 0)

    def efficiency(self, node_depth: int, parent_depth: int, has_state: bool, is_leaf: bool) -> float:
        saved = self.savings(node_depth, parent_depth)
        nbytes = self.node_bytes(node_depth, parent_depth, has_state, is_leaf)
        return saved / nbytes if nbytes > 0 else 0.0

    def hit_flops(self, hit_tokens: int) -> float:
        return self.geometry.flops_saved(hit_tokens).total if hit_tokens > 0 else 0.0


class ReferenceAccounting(Accounting):
    """The reference simulator's accounting, quirks included (``ref_*`` in model.py)."""

    name = "reference"

    def __init__(self, geometry: ModelGeometry) -> None:
        p = marconi_ref_params(geometry)
        self.D, self.N = p["D"], p["N"]
        self.n_attn, self.n_ssm, self.n_mlp = p["n_attn"], p["n_ssm"], p["n_mlp"]

    def efficiency(self, node_depth: int, parent_depth: int, has_state: bool, is_leaf: bool) -> float:
        if node_depth <= parent_depth:
            raise ValueError(f"empty edge [{parent_depth}, {node_depth})")
        return ref_node_efficiency(
            node_depth, parent_depth, self.D, self.N, self.n_attn, self.n_ssm, self.n_mlp
        )

    def hit_flops(self, hit_tokens: int) -> float:
        """The reference's FLOPs saved by a hit: every layer family over ``hit_tokens``."""
        if hit_tokens <= 0:
            return 0.0
        L = hit_tokens
        return (
            self.n_ssm * ref_mamba_flops(L, self.D, self.N)
            + self.n_attn * ref_attn_flops(L, self.D)
            + self.n_mlp * ref_mlp_flops(L, self.D)
        )
