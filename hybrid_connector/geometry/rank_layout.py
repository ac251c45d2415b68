"""Per tensor-parallel rank tensor layouts: the KV of a token range and one state checkpoint.

``ModelGeometry.kv_layout`` and ``ModelGeometry.state_layout`` are these functions; the
storage conventions (conv width ``kernel - 1``, recurrent state in ``state_dtype``, per-rank
shapes, vLLM's ``MambaStateShapeCalculator`` sharding) are in ``hybrid_connector.geometry.model``'s
docstring. Every function raises ValueError, naming the model, when the TP size cannot
shard a dimension the way vLLM does.
"""

from __future__ import annotations

from typing import Protocol

from hybrid_connector.geometry.layers import (
    AttentionDims,
    GDNDims,
    LayerSpec,
    Mamba1Dims,
    Mamba2Dims,
    MixerKind,
    ShortConvDims,
    TensorSpec,
)


class Geometry(Protocol):
    """The ``ModelGeometry`` fields a layout reads (read-only; ``model`` imports this
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


def kv_layout(g: Geometry, num_tokens: int) -> tuple[TensorSpec, ...]:
    """Per attention layer, K ``[num_tokens, kv_heads_per_rank, head_dim]`` then V (the same
    with ``v_dim``) in ``dtype``. Names are ``layers.{i}.k`` / ``layers.{i}.v``."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    idx = g.attention_layers
    if not idx:
        return ()
    assert g.attention is not None
    heads = kv_heads_per_rank(g)
    k_shape = (num_tokens, heads, g.attention.head_dim)
    v_shape = (num_tokens, heads, g.attention.v_dim)
    out: list[TensorSpec] = []
    for i in idx:
        out.append(TensorSpec(f"layers.{i}.k", k_shape, g.dtype))
        out.append(TensorSpec(f"layers.{i}.v", v_shape, g.dtype))
    return tuple(out)


def mixer_state(g: Geometry, layer: LayerSpec) -> tuple[TensorSpec, ...]:
    """The state tensors of one layer on one rank: conv state then recurrent state (none
    for a layer without a recurrent mixer, conv only for short conv)."""
    i, tp = layer.index, g.tp_size
    conv_name, rec_name = f"layers.{i}.conv_state", f"layers.{i}.recurrent_state"
    mixer = layer.mixer
    if mixer in (MixerKind.MAMBA2, MixerKind.HYBRID_PARALLEL):
        m = g.mamba2
        assert m is not None
        # vLLM replicates a single B/C group across ranks (extra_groups_for_head_shards).
        groups = m.n_groups if m.n_groups % tp == 0 else tp
        if m.n_groups % tp and m.n_groups != 1:
            raise ValueError(f"{g.name}: mamba n_groups {m.n_groups} incompatible with tp {tp}")
        channels = m.d_inner + 2 * groups * m.d_state
        return (
            TensorSpec(conv_name, (_divide("mamba conv channels", channels, tp), m.conv_kernel - 1), g.dtype),
            TensorSpec(
                rec_name,
                (_divide("mamba num_heads", m.num_heads, tp), m.head_dim, m.d_state),
                g.state_dtype,
            ),
        )
    if mixer == MixerKind.GDN:
        d = g.gdn
        assert d is not None
        return (
            TensorSpec(conv_name, (_divide("gdn conv channels", d.conv_channels, tp), d.conv_kernel - 1), g.dtype),
            TensorSpec(
                rec_name,
                (_divide("gdn num_v_heads", d.num_v_heads, tp), d.head_k_dim, d.head_v_dim),
                g.state_dtype,
            ),
        )
    if mixer == MixerKind.MAMBA1:
        m1 = g.mamba1
        assert m1 is not None
        d_in = _divide("mamba d_inner", m1.d_inner, tp)
        return (
            TensorSpec(conv_name, (d_in, m1.conv_kernel - 1), g.dtype),
            TensorSpec(rec_name, (d_in, m1.d_state), g.state_dtype),
        )
    if mixer == MixerKind.SHORT_CONV:
        s = g.short_conv
        assert s is not None
        return (
            TensorSpec(conv_name, (_divide("hidden_size", g.hidden_size, tp), s.conv_kernel - 1), g.dtype),
        )
    return ()


def state_layout(g: Geometry) -> tuple[TensorSpec, ...]:
    """One state checkpoint on one rank: per recurrent layer, in layer order, its conv state
    ``[channels/tp, conv_kernel - 1]`` (``dtype``) then its recurrent state (``state_dtype``;
    absent for short conv). Names are ``layers.{i}.conv_state`` /
    ``layers.{i}.recurrent_state``."""
    out: list[TensorSpec] = []
    for layer in g.layers:
        out.extend(mixer_state(g, layer))
    return tuple(out)
