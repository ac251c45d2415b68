"""Per tensor-parallel rank dimensions: the KV heads one rank holds and the shapes of one
recurrent layer's state on one rank.

Numbers only. Which tensors a payload holds, under which names, in which order and at which
byte offsets is ``hybrid_connector.payload.layout`` (built from these shapes), and
``ModelGeometry``'s byte figures are these shapes times their dtypes' sizes, so the two
agree by construction. The storage conventions (conv width ``kernel - 1``, recurrent state
in ``state_dtype``, vLLM's ``MambaStateShapeCalculator`` sharding) are in
``hybrid_connector.geometry.model``'s docstring. Every function raises ValueError, naming
the model, when the TP size cannot shard a dimension the way vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hybrid_connector.geometry.layers import (
    AttentionDims,
    GDNDims,
    LayerSpec,
    Mamba1Dims,
    Mamba2Dims,
    MixerKind,
    ShortConvDims,
)


class Geometry(Protocol):
    """The ``ModelGeometry`` fields the per-rank dims read (read-only; ``model`` imports this
    module, so it cannot be imported here)."""

    @property
    def name(self) -> str: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def state_dtype(self) -> str: ...
    @property
    def attention(self) -> AttentionDims | None: ...
    @property
    def mamba2(self) -> Mamba2Dims | None: ...
    @property
    def mamba1(self) -> Mamba1Dims | None: ...
    @property
    def gdn(self) -> GDNDims | None: ...
    @property
    def short_conv(self) -> ShortConvDims | None: ...
    @property
    def layers(self) -> tuple[LayerSpec, ...]: ...
    @property
    def attention_layers(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class StateShapes:
    """One recurrent layer's state on one rank: the conv state ``[channels / tp,
    conv_kernel - 1]`` (in the geometry's ``dtype``) and the recurrent state (in
    ``state_dtype``; None for a short conv, which has none)."""

    conv: tuple[int, ...]
    recurrent: tuple[int, ...] | None


def _divide(what: str, numerator: int, tp: int) -> int:
    if numerator % tp:
        raise ValueError(f"{what} = {numerator} is not divisible by tp_size = {tp}")
    return numerator // tp


def kv_heads_per_rank(g: Geometry) -> int:
    """KV heads one rank holds (the geometry must have attention)."""
    a = g.attention
    assert a is not None
    # vLLM: KV heads are sharded when divisible, replicated (one per rank) when fewer than TP.
    if a.num_kv_heads >= g.tp_size:
        return _divide("num_kv_heads", a.num_kv_heads, g.tp_size)
    if g.tp_size % a.num_kv_heads:
        raise ValueError(
            f"{g.name}: tp_size {g.tp_size} is not a multiple of num_kv_heads {a.num_kv_heads}"
        )
    return 1


def state_shapes(g: Geometry, layer: LayerSpec) -> StateShapes | None:
    """The state shapes of one layer on one rank; None for a layer without a recurrent
    mixer."""
    tp, mixer = g.tp_size, layer.mixer
    if mixer in (MixerKind.MAMBA2, MixerKind.HYBRID_PARALLEL):
        m = g.mamba2
        assert m is not None
        # vLLM replicates a single B/C group across ranks (extra_groups_for_head_shards).
        groups = m.n_groups if m.n_groups % tp == 0 else tp
        if m.n_groups % tp and m.n_groups != 1:
            raise ValueError(f"{g.name}: mamba n_groups {m.n_groups} incompatible with tp {tp}")
        channels = m.d_inner + 2 * groups * m.d_state
        return StateShapes((_divide("mamba conv channels", channels, tp), m.conv_kernel - 1),
                           (_divide("mamba num_heads", m.num_heads, tp), m.head_dim, m.d_state))
    if mixer == MixerKind.GDN:
        d = g.gdn
        assert d is not None
        return StateShapes((_divide("gdn conv channels", d.conv_channels, tp), d.conv_kernel - 1),
                           (_divide("gdn num_v_heads", d.num_v_heads, tp), d.head_k_dim,
                            d.head_v_dim))
    if mixer == MixerKind.MAMBA1:
        m1 = g.mamba1
        assert m1 is not None
        d_in = _divide("mamba d_inner", m1.d_inner, tp)
        return StateShapes((d_in, m1.conv_kernel - 1), (d_in, m1.d_state))
    if mixer == MixerKind.SHORT_CONV:
        s = g.short_conv
        assert s is not None
        return StateShapes((_divide("hidden_size", g.hidden_size, tp), s.conv_kernel - 1), None)
    return None


def check(g: Geometry) -> None:
    """ValueError (naming the model) unless every state and the KV shard over ``tp_size``
    the way vLLM shards them; run once, at construction."""
    for layer in g.layers:
        state_shapes(g, layer)
    if g.attention_layers:
        kv_heads_per_rank(g)
