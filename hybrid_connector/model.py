"""Model geometry for hybrid LLMs: layer kinds, dims, and the bytes and FLOPs per cached object.

A :class:`ModelGeometry` is the single engine-neutral description of a hybrid model that the
rest of the connector needs: which layers are attention and which are recurrent, how big one
token of KV is, how big one recurrent-state checkpoint is, how big an anchor is, and how many
FLOPs a cache hit avoids. It is built from a preset, a YAML/dict, or a transformers config.

Conventions (shared with vLLM's ``MambaStateShapeCalculator``, which is what the engine
integrations must match byte for byte):

* Conv state is stored as ``[channels, conv_kernel - 1]`` in ``dtype``: the last
  ``kernel - 1`` inputs are all a causal conv needs to continue. transformers' own cache keeps
  the full kernel width, and some vLLM backends keep the transpose ``[kernel - 1, channels]``;
  converting is the engine integration's concern, not this module's (the bytes are equal).
* Recurrent (SSM / delta-rule) state is stored in ``state_dtype`` (fp32 by default, as vLLM
  and SGLang do): Mamba2 ``[heads, head_dim, d_state]``, GDN ``[v_heads, head_k_dim,
  head_v_dim]``, Mamba1 ``[d_inner, d_state]``. Short conv has no recurrent state.
* Byte figures are per tensor-parallel rank. FLOP figures are whole-model (summed over ranks).
* Batch dims are never included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = [
    "AttentionDims",
    "FFNKind",
    "FlopBreakdown",
    "GDNDims",
    "LayerSpec",
    "MLPDims",
    "Mamba1Dims",
    "Mamba2Dims",
    "MixerKind",
    "ModelGeometry",
    "MoEDims",
    "ShortConvDims",
    "TensorSpec",
    "dtype_bytes",
    "ref_attn_flops",
    "ref_kv_bytes",
    "ref_mamba_flops",
    "ref_mlp_flops",
    "ref_state_bytes",
]

# --------------------------------------------------------------------------------------------
# dtypes

_DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}
_DTYPE_ALIASES: dict[str, str] = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def canonical_dtype(dtype: object) -> str:
    """Return the canonical name (``"bfloat16"``, ``"float32"``...) of a dtype given as a
    string alias (``"bf16"``, ``"torch.float16"``) or a ``torch.dtype``. Raises ValueError."""
    name = str(dtype).strip().lower()
    name = name.removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(_DTYPE_BYTES)}")
    return name


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (canonical names, common aliases and ``torch.*`` spellings
    accepted). Raises ValueError for an unknown dtype."""
    return _DTYPE_BYTES[canonical_dtype(dtype)]


# --------------------------------------------------------------------------------------------
# layer kinds and per-family dims


class MixerKind(StrEnum):
    """The token mixer of one layer.

    ``HYBRID_PARALLEL`` is a layer that runs an attention mixer and a Mamba2 mixer side by side
    on the same input (Falcon-H1): it owns KV *and* a recurrent state, so it is in both
    :attr:`ModelGeometry.attention_layers` and :attr:`ModelGeometry.recurrent_layers`.
    ``MAMBA1`` is the selective-scan Mamba of Jamba (per-channel state, no heads).
    ``NONE`` is an FFN-only layer (Nemotron-H ``-``/``E`` layers).
    """

    ATTENTION = "attention"
    MAMBA2 = "mamba2"
    GDN = "gdn"
    SHORT_CONV = "short_conv"
    NONE = "none"
    MAMBA1 = "mamba1"
    HYBRID_PARALLEL = "hybrid_parallel"

    @property
    def has_kv(self) -> bool:
        return self in (MixerKind.ATTENTION, MixerKind.HYBRID_PARALLEL)

    @property
    def is_recurrent(self) -> bool:
        return self in _RECURRENT_KINDS


_RECURRENT_KINDS = frozenset(
    {
        MixerKind.MAMBA2,
        MixerKind.GDN,
        MixerKind.SHORT_CONV,
        MixerKind.MAMBA1,
        MixerKind.HYBRID_PARALLEL,
    }
)


class FFNKind(StrEnum):
    """The feed-forward block of one layer."""

    MLP = "mlp"
    MOE = "moe"
    NONE = "none"


@dataclass(frozen=True)
class AttentionDims:
    """Attention geometry. ``output_gate``: q_proj also emits a sigmoid gate of the same width
    (Qwen3.5, Qwen3-Next), which doubles the q projection FLOPs but not the KV."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    output_gate: bool = False


@dataclass(frozen=True)
class Mamba2Dims:
    """Mamba2 mixer geometry. ``d_inner = num_heads * head_dim``; the causal conv runs over
    ``d_inner + 2 * n_groups * d_state`` channels (x, B, C)."""

    num_heads: int
    head_dim: int
    d_state: int
    n_groups: int
    conv_kernel: int

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state


@dataclass(frozen=True)
class Mamba1Dims:
    """Mamba (v1, selective scan) geometry as in Jamba: conv over ``d_inner`` channels, state
    ``[d_inner, d_state]``, ``dt_rank`` is the low-rank dt projection width."""

    d_inner: int
    d_state: int
    conv_kernel: int
    dt_rank: int

    @property
    def conv_channels(self) -> int:
        return self.d_inner


@dataclass(frozen=True)
class GDNDims:
    """Gated DeltaNet geometry. ``key_dim = num_k_heads * head_k_dim``, ``value_dim =
    num_v_heads * head_v_dim``; the conv runs over q, k and v: ``2 * key_dim + value_dim``."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class ShortConvDims:
    """Gated short convolution (LFM2 style): conv over ``hidden_size`` channels, no
    recurrent state."""

    conv_kernel: int


@dataclass(frozen=True)
class MLPDims:
    """Dense FFN. ``gated``: SwiGLU-style (gate+up+down, 3 matrices) vs plain up+down (2
    matrices, e.g. Nemotron-H's relu2 MLP)."""

    intermediate_size: int
    gated: bool = True


@dataclass(frozen=True)
class MoEDims:
    """Sparse MoE FFN: ``top_k`` routed experts of width ``expert_intermediate_size`` plus an
    always-on shared expert of width ``shared_intermediate_size`` (0 when there is none)."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    gated: bool = True


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: its position, token mixer and FFN."""

    index: int
    mixer: MixerKind
    ffn: FFNKind


@dataclass(frozen=True)
class TensorSpec:
    """Name, per-rank shape (no batch dim) and dtype name of one stored tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class FlopBreakdown:
    """FLOPs (2 per multiply-add) split by family. ``mamba1`` is Jamba's Mamba (v1) mixer; a
    Falcon-H1 parallel layer contributes to both ``attention`` and ``mamba2``."""

    attention: float
    mamba2: float
    gdn: float
    short_conv: float
    mlp: float
    moe: float
    mamba1: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.attention
            + self.mamba2
            + self.gdn
            + self.short_conv
            + self.mlp
            + self.moe
            + self.mamba1
        )

    def __add__(self, other: FlopBreakdown) -> FlopBreakdown:
        return FlopBreakdown(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


# --------------------------------------------------------------------------------------------
# per-family FLOP formulas (L tokens at absolute positions [P, P + L), 2 FLOPs per MAC)


def _causal_context_sum(num_tokens: int, prefix_tokens: int) -> int:
    """Sum over query positions t in [P, P+L) of the number of keys attended, t + 1."""
    n, p = num_tokens, prefix_tokens
    return n * p + n * (n + 1) // 2


def attention_layer_flops(a: AttentionDims, d: int, num_tokens: int, prefix_tokens: int) -> float:
    """One attention layer: q (x2 with an output gate), k, v, o projections, plus QK^T and
    PV, each ``2 * n_heads * head_dim`` FLOPs per (query, key) pair over the causal context.
    Rotary, softmax and norms are not counted."""
    n = num_tokens
    q_out = a.num_heads * a.head_dim * (2 if a.output_gate else 1)
    kv_out = 2 * a.num_kv_heads * a.head_dim
    proj = 2 * n * d * (q_out + kv_out) + 2 * n * a.num_heads * a.head_dim * d
    scores = 4 * a.num_heads * a.head_dim * _causal_context_sum(n, prefix_tokens)
    return float(proj + scores)


def mamba2_layer_flops(m: Mamba2Dims, d: int, num_tokens: int) -> float:
    """One Mamba2 layer: in_proj to ``2*d_inner + 2*n_groups*d_state + n_heads`` (z, xBC, dt),
    depthwise conv ``2*channels*K``, the scan in recurrent form ``5*d_inner*d_state`` per token
    (state decay and B x outer-product update 3, C readout 2) and out_proj. Element-wise gate,
    norm and D-skip terms (O(d_inner)) are not counted."""
    n = num_tokens
    in_proj = 2 * n * d * (2 * m.d_inner + 2 * m.n_groups * m.d_state + m.num_heads)
    conv = 2 * n * m.conv_channels * m.conv_kernel
    scan = 5 * n * m.d_inner * m.d_state
    out_proj = 2 * n * m.d_inner * d
    return float(in_proj + conv + scan + out_proj)


def mamba1_layer_flops(m: Mamba1Dims, d: int, num_tokens: int) -> float:
    """One Mamba (v1) layer: in_proj to ``2*d_inner``, conv, x_proj to ``dt_rank + 2*d_state``,
    dt_proj, the selective scan ``7*d_inner*d_state`` per token (discretise dt*A and exp 2,
    decay and update 3, readout 2) and out_proj."""
    n = num_tokens
    in_proj = 2 * n * d * 2 * m.d_inner
    conv = 2 * n * m.d_inner * m.conv_kernel
    x_proj = 2 * n * m.d_inner * (m.dt_rank + 2 * m.d_state)
    dt_proj = 2 * n * m.dt_rank * m.d_inner
    scan = 7 * n * m.d_inner * m.d_state
    out_proj = 2 * n * m.d_inner * d
    return float(in_proj + conv + x_proj + dt_proj + scan + out_proj)


def gdn_layer_flops(g: GDNDims, d: int, num_tokens: int) -> float:
    """One Gated DeltaNet layer. The first three terms are the SGLang Marconi fork's formula
    (``marconi_utils.py``): input projections ``2*L*D*(2*key_dim + 2*value_dim + 2*n_v_heads)``
    (q, k, v, z, beta, g), delta-rule state work ``8*L*value_dim*head_k_dim`` and
    ``4*L*value_dim`` element-wise. That formula omits two matmul terms, which we add: the
    depthwise conv over q, k, v ``2*L*(2*key_dim + value_dim)*K`` and out_proj
    ``2*L*value_dim*D``."""
    n = num_tokens
    ref = (
        2 * n * d * (2 * g.key_dim + 2 * g.value_dim + 2 * g.num_v_heads)
        + 8 * n * g.value_dim * g.head_k_dim
        + 4 * n * g.value_dim
    )
    conv = 2 * n * g.conv_channels * g.conv_kernel
    out_proj = 2 * n * g.value_dim * d
    return float(ref + conv + out_proj)


def short_conv_layer_flops(s: ShortConvDims, d: int, num_tokens: int) -> float:
    """One gated short-conv layer (LFM2): in_proj ``D -> 3D`` (B, C, x), depthwise conv
    ``2*D*K`` and out_proj ``D -> D``; the two element-wise gates are not counted."""
    n = num_tokens
    return float(2 * n * d * 3 * d + 2 * n * d * s.conv_kernel + 2 * n * d * d)


def mlp_layer_flops(m: MLPDims, d: int, num_tokens: int) -> float:
    """Dense FFN: ``6*L*D*I`` gated (SwiGLU), ``4*L*D*I`` ungated."""
    return float((6 if m.gated else 4) * num_tokens * d * m.intermediate_size)


def moe_layer_flops(m: MoEDims, d: int, num_tokens: int) -> float:
    """MoE FFN: ``6*L*D*(top_k*I_moe + I_shared)`` (4 instead of 6 when ungated) plus the
    router ``2*L*D*E``. Not counted: expert selection and scatter, and Qwen3-Next's scalar
    shared-expert gate (``2*L*D``, under 0.1% of the layer)."""
    per = 6 if m.gated else 4
    experts = per * num_tokens * d * (m.top_k * m.expert_intermediate_size + m.shared_intermediate_size)
    router = 2 * num_tokens * d * m.num_experts
    return float(experts + router)


# --------------------------------------------------------------------------------------------
# the reference simulator's formulas (marconi_reference mode)


def ref_attn_flops(L: int | float, D: int | float) -> float:
    """Attention FLOPs per layer exactly as the Marconi reference simulator computes them:
    ``8*L*D^2 + 4*L^2*D`` (MHA, whole sequence of length L from position 0)."""
    return float(8 * L * D * D + 4 * L * L * D)


def ref_mlp_flops(L: int | float, D: int | float) -> float:
    """MLP FLOPs per layer as in the Marconi reference: ``16*L*D^2`` (4x up-projection)."""
    return float(16 * L * D * D)


def ref_mamba_flops(L: int | float, D: int | float, N: int | float) -> float:
    """Mamba FLOPs per layer as in the Marconi reference, camera-ready form:
    ``12*L*D^2 + 16*L*D*N + 10*L*D`` (the original submission had ``10*L`` as the last term)."""
    return float(12 * L * D * D + 16 * L * D * N + 10 * L * D)


def ref_kv_bytes(L: int | float, D: int | float) -> float:
    """KV bytes per attention layer as in the Marconi reference: ``2*L*D*2`` (K and V, fp16,
    MHA-sized: the reference ignores GQA, a known quirk kept on purpose)."""
    return float(2 * L * D * 2)


def ref_state_bytes(D: int | float, N: int | float) -> float:
    """SSM state bytes per layer as in the Marconi reference: ``D*N*2 + (2*D + 2*N)*4*2``
    (state in fp16 plus a conv term assuming kernel 4, expand 2). Quirks kept on purpose."""
    return float(D * N * 2 + (2 * D + 2 * N) * 4 * 2)


def ref_node_savings(
    l_total: int,
    l_parent: int,
    D: int,
    N: int,
    n_attn: int,
    n_ssm: int,
    n_mlp: int,
) -> float:
    """FLOPs a hit on a radix node saves, exactly as the reference simulator computes it:
    ``n_ssm*mamba(l_node) + n_attn*(attn(l_total) - attn(l_parent)) + n_mlp*(mlp(l_total) -
    attn(l_parent))`` with ``l_node = l_total - l_parent``. The ``attn`` in the MLP term is the
    reference's bug, reproduced deliberately."""
    l_node = l_total - l_parent
    return (
        n_ssm * ref_mamba_flops(l_node, D, N)
        + n_attn * (ref_attn_flops(l_total, D) - ref_attn_flops(l_parent, D))
        + n_mlp * (ref_mlp_flops(l_total, D) - ref_attn_flops(l_parent, D))
    )


def ref_node_memory(l_total: int, D: int, N: int, n_attn: int, n_ssm: int) -> float:
    """Bytes charged to a radix node by the reference: ``n_ssm*state + n_attn*KV(l_total)``,
    i.e. the whole path's KV rather than the node's own (reference quirk)."""
    return n_ssm * ref_state_bytes(D, N) + n_attn * ref_kv_bytes(l_total, D)


def ref_node_efficiency(
    l_total: int,
    l_parent: int,
    D: int,
    N: int,
    n_attn: int,
    n_ssm: int,
    n_mlp: int,
) -> float:
    """Reference FLOP efficiency of a node: :func:`ref_node_savings` / :func:`ref_node_memory`."""
    mem = ref_node_memory(l_total, D, N, n_attn, n_ssm)
    if mem <= 0:
        return 0.0
    return ref_node_savings(l_total, l_parent, D, N, n_attn, n_ssm, n_mlp) / mem


# --------------------------------------------------------------------------------------------
# the geometry

_DIM_CLASSES: dict[str, type] = {
    "attention": AttentionDims,
    "mamba2": Mamba2Dims,
    "mamba1": Mamba1Dims,
    "gdn": GDNDims,
    "short_conv": ShortConvDims,
    "mlp": MLPDims,
    "moe": MoEDims,
}

# which dims block a mixer / FFN kind needs
_MIXER_NEEDS: dict[MixerKind, tuple[str, ...]] = {
    MixerKind.ATTENTION: ("attention",),
    MixerKind.MAMBA2: ("mamba2",),
    MixerKind.MAMBA1: ("mamba1",),
    MixerKind.GDN: ("gdn",),
    MixerKind.SHORT_CONV: ("short_conv",),
    MixerKind.HYBRID_PARALLEL: ("attention", "mamba2"),
    MixerKind.NONE: (),
}
_FFN_NEEDS: dict[FFNKind, tuple[str, ...]] = {
    FFNKind.MLP: ("mlp",),
    FFNKind.MOE: ("moe",),
    FFNKind.NONE: (),
}


def _divide(what: str, numerator: int, tp: int) -> int:
    if numerator % tp:
        raise ValueError(f"{what} = {numerator} is not divisible by tp_size = {tp}")
    return numerator // tp


@dataclass(frozen=True)
class ModelGeometry:
    """Geometry of a hybrid model, per tensor-parallel rank where bytes are concerned.

    ``layers`` must be indexed 0..n-1 in order. Every dims block a layer kind needs must be
    present (checked at construction, ValueError otherwise). ``dtype`` is the dtype of KV,
    conv state and hidden states (anchors); ``state_dtype`` that of recurrent state.
    """

    name: str
    architecture: str
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerSpec, ...]
    attention: AttentionDims | None = None
    mamba2: Mamba2Dims | None = None
    gdn: GDNDims | None = None
    short_conv: ShortConvDims | None = None
    mlp: MLPDims | None = None
    moe: MoEDims | None = None
    dtype: str = "bfloat16"
    state_dtype: str = "float32"
    tp_size: int = 1
    mamba1: Mamba1Dims | None = None
    # Memo for the derived figures (the dataclass is frozen, so they never go stale); policies
    # query them per node on hot paths.
    _memo: dict[object, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Accept plain strings for kinds (YAML, hand-written presets); store enums.
        object.__setattr__(
            self,
            "layers",
            tuple(LayerSpec(x.index, MixerKind(x.mixer), FFNKind(x.ffn)) for x in self.layers),
        )
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "state_dtype", canonical_dtype(self.state_dtype))
        if not self.layers:
            raise ValueError(f"{self.name}: a model needs at least one layer")
        if self.hidden_size <= 0 or self.vocab_size <= 0:
            raise ValueError(f"{self.name}: hidden_size and vocab_size must be positive")
        if self.tp_size < 1:
            raise ValueError(f"{self.name}: tp_size must be >= 1, got {self.tp_size}")
        for key in _DIM_CLASSES:
            dims = getattr(self, key)
            if dims is None:
                continue
            for f in fields(dims):
                v = getattr(dims, f.name)
                if isinstance(v, bool):
                    continue
                floor = 0 if f.name == "shared_intermediate_size" else 1
                if not isinstance(v, int) or v < floor:
                    raise ValueError(f"{self.name}: {key}.{f.name} must be an integer >= {floor}, got {v!r}")
        a = self.attention
        if a is not None and a.num_heads % a.num_kv_heads:
            raise ValueError(
                f"{self.name}: attention num_heads {a.num_heads} is not a multiple of "
                f"num_kv_heads {a.num_kv_heads}"
            )
        for i, layer in enumerate(self.layers):
            if layer.index != i:
                raise ValueError(f"{self.name}: layer at position {i} has index {layer.index}")
            for need in _MIXER_NEEDS[MixerKind(layer.mixer)] + _FFN_NEEDS[FFNKind(layer.ffn)]:
                if getattr(self, need) is None:
                    raise ValueError(
                        f"{self.name}: layer {i} ({layer.mixer.value}/{layer.ffn.value}) "
                        f"needs `{need}` dims, which are missing"
                    )
        # Fail at construction, not at first use, if the TP layout is impossible.
        self.state_layout()
        self.kv_layout(1)

    # ---- layer sets

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of layers that hold KV (attention and parallel hybrid layers)."""
        return tuple(layer.index for layer in self.layers if layer.mixer.has_kv)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """Indices of layers that hold recurrent state (incl. parallel hybrid layers)."""
        return tuple(layer.index for layer in self.layers if layer.mixer.is_recurrent)

    def recurrent_groups(self) -> tuple[tuple[int, ...], ...]:
        """Maximal runs of recurrent layers not separated by an attention layer.

        FFN-only layers (mixer NONE) do not break a run. A parallel hybrid layer (Falcon-H1)
        needs attention over the prefix, so it is a group of its own: every Falcon-H1 layer is
        one group. Anchors store one hidden state per group per token.
        """
        memo = self._memo.get("groups")
        if memo is not None:
            return memo
        groups: list[tuple[int, ...]] = []
        run: list[int] = []
        for layer in self.layers:
            if layer.mixer == MixerKind.HYBRID_PARALLEL:
                if run:
                    groups.append(tuple(run))
                    run = []
                groups.append((layer.index,))
            elif layer.mixer == MixerKind.ATTENTION:
                if run:
                    groups.append(tuple(run))
                    run = []
            elif layer.mixer.is_recurrent:
                run.append(layer.index)
        if run:
            groups.append(tuple(run))
        self._memo["groups"] = tuple(groups)
        return tuple(groups)

    # ---- per-rank layouts and bytes

    def _kv_heads_per_rank(self) -> int:
        a = self.attention
        assert a is not None
        # vLLM: KV heads are sharded when divisible, replicated (one per rank) when fewer than TP.
        if a.num_kv_heads >= self.tp_size:
            return _divide("num_kv_heads", a.num_kv_heads, self.tp_size)
        if self.tp_size % a.num_kv_heads:
            raise ValueError(
                f"{self.name}: tp_size {self.tp_size} is not a multiple of num_kv_heads {a.num_kv_heads}"
            )
        return 1

    def kv_layout(self, num_tokens: int) -> tuple[TensorSpec, ...]:
        """Per attention layer, K then V, each ``[num_tokens, kv_heads_per_rank, head_dim]``
        in ``dtype``. Names are ``layers.{i}.k`` / ``layers.{i}.v``."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        idx = self.attention_layers
        if not idx:
            return ()
        assert self.attention is not None
        shape = (num_tokens, self._kv_heads_per_rank(), self.attention.head_dim)
        out: list[TensorSpec] = []
        for i in idx:
            out.append(TensorSpec(f"layers.{i}.k", shape, self.dtype))
            out.append(TensorSpec(f"layers.{i}.v", shape, self.dtype))
        return tuple(out)

    def kv_bytes_per_token(self) -> int:
        """K+V bytes of one token over all attention layers on one rank:
        ``2 * kv_heads_per_rank * head_dim * dtype_bytes`` per attention layer."""
        if "kv_bytes" not in self._memo:
            self._memo["kv_bytes"] = sum(t.nbytes for t in self.kv_layout(1))
        return int(self._memo["kv_bytes"])

    def _mixer_state(self, layer: LayerSpec) -> tuple[TensorSpec, ...]:
        i, tp = layer.index, self.tp_size
        conv_name, rec_name = f"layers.{i}.conv_state", f"layers.{i}.recurrent_state"
        mixer = layer.mixer
        if mixer in (MixerKind.MAMBA2, MixerKind.HYBRID_PARALLEL):
            m = self.mamba2
            assert m is not None
            # vLLM replicates a single B/C group across ranks (extra_groups_for_head_shards).
            groups = m.n_groups if m.n_groups % tp == 0 else tp
            if m.n_groups % tp and m.n_groups != 1:
                raise ValueError(f"{self.name}: mamba n_groups {m.n_groups} incompatible with tp {tp}")
            channels = m.d_inner + 2 * groups * m.d_state
            return (
                TensorSpec(conv_name, (_divide("mamba conv channels", channels, tp), m.conv_kernel - 1), self.dtype),
                TensorSpec(
                    rec_name,
                    (_divide("mamba num_heads", m.num_heads, tp), m.head_dim, m.d_state),
                    self.state_dtype,
                ),
            )
        if mixer == MixerKind.GDN:
            g = self.gdn
            assert g is not None
            return (
                TensorSpec(conv_name, (_divide("gdn conv channels", g.conv_channels, tp), g.conv_kernel - 1), self.dtype),
                TensorSpec(
                    rec_name,
                    (_divide("gdn num_v_heads", g.num_v_heads, tp), g.head_k_dim, g.head_v_dim),
                    self.state_dtype,
                ),
            )
        if mixer == MixerKind.MAMBA1:
            m1 = self.mamba1
            assert m1 is not None
            d_in = _divide("mamba d_inner", m1.d_inner, tp)
            return (
                TensorSpec(conv_name, (d_in, m1.conv_kernel - 1), self.dtype),
                TensorSpec(rec_name, (d_in, m1.d_state), self.state_dtype),
            )
        if mixer == MixerKind.SHORT_CONV:
            s = self.short_conv
            assert s is not None
            return (
                TensorSpec(conv_name, (_divide("hidden_size", self.hidden_size, tp), s.conv_kernel - 1), self.dtype),
            )
        return ()

    def state_layout(self) -> tuple[TensorSpec, ...]:
        """One state checkpoint on one rank: per recurrent layer, in layer order, its conv state
        ``[channels/tp, conv_kernel - 1]`` (``dtype``) then its recurrent state (``state_dtype``;
        absent for short conv). Names are ``layers.{i}.conv_state`` /
        ``layers.{i}.recurrent_state``."""
        out: list[TensorSpec] = []
        for layer in self.layers:
            out.extend(self._mixer_state(layer))
        return tuple(out)

    def state_bytes(self) -> int:
        """Bytes of one state checkpoint (all recurrent layers, conv + recurrent) on one rank."""
        if "state_bytes" not in self._memo:
            self._memo["state_bytes"] = sum(t.nbytes for t in self.state_layout())
        return int(self._memo["state_bytes"])

    def state_bytes_per_layer(self) -> dict[int, int]:
        """Checkpoint bytes split by recurrent layer index (per rank)."""
        return {
            layer.index: sum(t.nbytes for t in self._mixer_state(layer))
            for layer in self.layers
            if layer.mixer.is_recurrent
        }

    def anchor_bytes_per_token(self) -> int:
        """Bytes of one anchor token: one hidden state (``hidden_size`` in ``dtype``, replicated
        across TP ranks) per recurrent group."""
        return self.hidden_size * dtype_bytes(self.dtype) * len(self.recurrent_groups())

    # ---- FLOPs

    def flops_saved(self, num_tokens: int, prefix_tokens: int = 0) -> FlopBreakdown:
        """Whole-model FLOPs (all TP ranks) avoided by not recomputing the tokens
        ``[prefix_tokens, prefix_tokens + num_tokens)``: every layer's mixer and FFN over those
        tokens, with the attention score/value term summed over each token's full causal
        context. Embedding, lm_head, norms and rotary are not counted. See the
        ``*_layer_flops`` functions for exactly what each family counts."""
        if num_tokens < 0 or prefix_tokens < 0:
            raise ValueError(f"num_tokens and prefix_tokens must be >= 0, got {num_tokens}, {prefix_tokens}")
        key = ("flops", num_tokens, prefix_tokens)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        n, d = num_tokens, self.hidden_size
        acc = dict.fromkeys((f.name for f in fields(FlopBreakdown)), 0.0)
        counts = self.layer_counts()
        if self.attention is not None:
            acc["attention"] = counts["attention"] * attention_layer_flops(self.attention, d, n, prefix_tokens)
        if self.mamba2 is not None:
            acc["mamba2"] = counts["mamba2"] * mamba2_layer_flops(self.mamba2, d, n)
        if self.mamba1 is not None:
            acc["mamba1"] = counts["mamba1"] * mamba1_layer_flops(self.mamba1, d, n)
        if self.gdn is not None:
            acc["gdn"] = counts["gdn"] * gdn_layer_flops(self.gdn, d, n)
        if self.short_conv is not None:
            acc["short_conv"] = counts["short_conv"] * short_conv_layer_flops(self.short_conv, d, n)
        if self.mlp is not None:
            acc["mlp"] = counts["mlp"] * mlp_layer_flops(self.mlp, d, n)
        if self.moe is not None:
            acc["moe"] = counts["moe"] * moe_layer_flops(self.moe, d, n)
        result = FlopBreakdown(**acc)
        if len(self._memo) < 4096:  # bounded: policies ask the same lengths repeatedly
            self._memo[key] = result
        return result

    def layer_counts(self) -> dict[str, int]:
        """How many layers carry each family (a parallel hybrid layer counts for attention and
        mamba2)."""
        c = dict.fromkeys(("attention", "mamba2", "mamba1", "gdn", "short_conv", "mlp", "moe"), 0)
        for layer in self.layers:
            for need in _MIXER_NEEDS[layer.mixer] + _FFN_NEEDS[layer.ffn]:
                c[need] += 1
        return c

    # ---- identity and (de)serialisation

    def fingerprint_fields(self) -> dict[str, object]:
        """Everything about geometry, dtypes and TP layout that changes what a stored object
        means or how big it is. ``name`` is deliberately excluded (the same model reached via
        two engines must share objects); weight identity (model id, revision) is the key
        builder's concern."""
        d = self.to_dict()
        d.pop("name")
        return d

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON/YAML-safe). Layers are ``"mixer+ffn"`` strings in order."""
        out: dict[str, Any] = {
            "name": self.name,
            "architecture": self.architecture,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "layers": [f"{layer.mixer.value}+{layer.ffn.value}" for layer in self.layers],
        }
        for key, cls in _DIM_CLASSES.items():
            dims = getattr(self, key)
            if dims is not None:
                out[key] = {f.name: getattr(dims, f.name) for f in fields(cls)}
        out["dtype"] = self.dtype
        out["state_dtype"] = self.state_dtype
        out["tp_size"] = self.tp_size
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "geometry") -> ModelGeometry:
        """Inverse of :meth:`to_dict`. Layers may be ``"mixer+ffn"`` strings or
        ``{"mixer": ..., "ffn": ...}`` mappings. Raises ValueError naming ``source`` and the
        offending key for unknown keys, missing keys and bad values."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{source}: expected a mapping, got {type(d).__name__}")
        allowed = {"name", "architecture", "hidden_size", "vocab_size", "layers", "dtype", "state_dtype", "tp_size"}
        allowed |= set(_DIM_CLASSES)
        for key in d:
            if key not in allowed:
                raise ValueError(f"{source}: unknown key {key!r}; allowed: {sorted(allowed)}")
        for key in ("name", "architecture", "hidden_size", "vocab_size", "layers"):
            if key not in d:
                raise ValueError(f"{source}: missing required key {key!r}")
        kwargs: dict[str, Any] = {}
        for key in ("name", "architecture", "dtype", "state_dtype"):
            if key in d:
                if not isinstance(d[key], str):
                    raise ValueError(f"{source}: key {key!r} must be a string, got {d[key]!r}")
                kwargs[key] = d[key]
        for key in ("hidden_size", "vocab_size", "tp_size"):
            if key in d:
                kwargs[key] = _as_int(d[key], f"{source}: key {key!r}")
        kwargs["layers"] = _parse_layers(d["layers"], source)
        for key, dim_cls in _DIM_CLASSES.items():
            if d.get(key) is not None:
                kwargs[key] = _parse_dims(dim_cls, d[key], f"{source}: key {key!r}")
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from e

    @classmethod
    def from_yaml(cls, path: str | Path) -> ModelGeometry:
        """Load a geometry written as the :meth:`to_dict` mapping, optionally nested under a
        top-level ``model:`` key. Errors name the file and the bad key."""
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as e:
            raise ValueError(f"{p}: cannot read model geometry: {e}") from e
        except yaml.YAMLError as e:
            raise ValueError(f"{p}: invalid YAML: {e}") from e
        if isinstance(data, Mapping) and set(data) == {"model"}:
            data = data["model"]
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_hf_config(
        cls,
        cfg: Any,
        *,
        name: str | None = None,
        dtype: str | None = None,
        state_dtype: str | None = None,
        tp_size: int = 1,
    ) -> ModelGeometry:
        """Build from a transformers config object (Qwen3.5 text or multimodal wrapper,
        Qwen3.5-MoE, Qwen3-Next, Nemotron-H, Bamba, Jamba, Falcon-H1, GraniteMoeHybrid, LFM2).
        ``dtype`` defaults to the config's ``dtype`` (else bfloat16); ``state_dtype`` to the
        config's mamba SSM cache dtype where it has one (else float32). Raises ValueError for
        an unsupported ``model_type``."""
        kw = _geometry_kwargs_from_hf(cfg)
        if name is not None:
            kw["name"] = name
        if dtype is not None:
            kw["dtype"] = dtype
        if state_dtype is not None:
            kw["state_dtype"] = state_dtype
        kw["tp_size"] = tp_size
        return cls(**kw)


def _as_int(v: object, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where} must be an integer, got {v!r}")
    return v


def _parse_layers(raw: object, source: str) -> tuple[LayerSpec, ...]:
    if not isinstance(raw, list | tuple) or not raw:
        raise ValueError(f"{source}: key 'layers' must be a non-empty list")
    out: list[LayerSpec] = []
    for i, item in enumerate(raw):
        where = f"{source}: key 'layers[{i}]'"
        if isinstance(item, str):
            mixer_s, sep, ffn_s = item.partition("+")
            if not sep:
                raise ValueError(f"{where}: expected 'mixer+ffn', got {item!r}")
        elif isinstance(item, Mapping):
            extra = set(item) - {"mixer", "ffn", "index"}
            if extra:
                raise ValueError(f"{where}: unknown key(s) {sorted(extra)}")
            mixer_s, ffn_s = item.get("mixer", "none"), item.get("ffn", "none")
        else:
            raise ValueError(f"{where}: expected 'mixer+ffn' or a mapping, got {item!r}")
        try:
            mixer = MixerKind(mixer_s)
        except ValueError:
            raise ValueError(f"{where}: unknown mixer {mixer_s!r}; known: {[m.value for m in MixerKind]}") from None
        try:
            ffn = FFNKind(ffn_s)
        except ValueError:
            raise ValueError(f"{where}: unknown ffn {ffn_s!r}; known: {[f.value for f in FFNKind]}") from None
        out.append(LayerSpec(i, mixer, ffn))
    return tuple(out)


def _parse_dims(dim_cls: type, raw: object, where: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping, got {raw!r}")
    names = {f.name: f for f in fields(dim_cls)}
    for k in raw:
        if k not in names:
            raise ValueError(f"{where}: unknown key {k!r}; allowed: {sorted(names)}")
    kwargs: dict[str, Any] = {}
    for fname, f in names.items():
        if fname not in raw:
            if f.default is f.default_factory:  # both MISSING: a required field
                raise ValueError(f"{where}: missing key {fname!r}")
            continue
        v = raw[fname]
        if isinstance(f.default, bool):
            if not isinstance(v, bool):
                raise ValueError(f"{where}.{fname} must be a boolean, got {v!r}")
            kwargs[fname] = v
        else:
            kwargs[fname] = _as_int(v, f"{where}.{fname}")
            if kwargs[fname] < 0:
                raise ValueError(f"{where}.{fname} must be >= 0, got {v!r}")
    return dim_cls(**kwargs)


# --------------------------------------------------------------------------------------------
# transformers config adapter (duck-typed: no transformers import needed here)

_ATTN_NAMES = frozenset({"attention", "full_attention", "attn", "*"})
_RECURRENT_NAMES = frozenset({"mamba", "linear_attention", "mamba2", "M"})


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    v = getattr(cfg, key, default)
    return default if v is None else v


def _hf_dtype(cfg: Any) -> str:
    # Only `dtype`: reading the deprecated `torch_dtype` alias makes transformers warn.
    v = getattr(cfg, "dtype", None)
    if v is not None and str(v).lower() not in ("auto", "none"):
        try:
            return canonical_dtype(v)
        except ValueError:
            pass
    return "bfloat16"


def _hf_attention(cfg: Any, output_gate: bool = False) -> AttentionDims:
    heads = int(cfg.num_attention_heads)
    kv = int(_cfg_get(cfg, "num_key_value_heads", heads))
    head_dim = int(_cfg_get(cfg, "head_dim", cfg.hidden_size // heads))
    return AttentionDims(heads, kv, head_dim, output_gate)


def _hf_mamba2(cfg: Any, d_inner: int) -> Mamba2Dims:
    heads = int(cfg.mamba_n_heads)
    head_dim = cfg.mamba_d_head
    if not isinstance(head_dim, int):  # "auto"
        head_dim = d_inner // heads
    return Mamba2Dims(heads, int(head_dim), int(cfg.mamba_d_state), int(cfg.mamba_n_groups), int(cfg.mamba_d_conv))


def _lfm2_ffn_dim(cfg: Any) -> int:
    """LFM2's effective SwiGLU width (mirrors ``Lfm2MLP``: 2/3 scaling, multiplier, rounding)."""
    size = int(cfg.intermediate_size)
    if getattr(cfg, "block_auto_adjust_ff_dim", False):
        size = int(2 * size / 3)
        mult = getattr(cfg, "block_ffn_dim_multiplier", None)
        if mult is not None:
            size = int(mult * size)
            m = int(cfg.block_multiple_of)
            size = m * ((size + m - 1) // m)
    return size


def _layer_kind(name: str, arch: str, i: int) -> MixerKind:
    if name in _ATTN_NAMES:
        return MixerKind.ATTENTION
    if name in _RECURRENT_NAMES:
        return MixerKind.MAMBA2
    raise ValueError(f"{arch}: layer {i} has unsupported layer type {name!r}")


def _geometry_kwargs_from_hf(cfg: Any) -> dict[str, Any]:
    """Translate one transformers config into ModelGeometry keyword arguments."""
    text = getattr(cfg, "text_config", None)
    mt = str(getattr(cfg, "model_type", ""))
    if text is not None and mt in ("qwen3_5", "qwen3_5_moe"):
        cfg, mt = text, str(text.model_type)
    name = str(getattr(cfg, "_name_or_path", "") or mt)
    d = int(cfg.hidden_size)
    kw: dict[str, Any] = {
        "name": name,
        "architecture": mt,
        "hidden_size": d,
        "vocab_size": int(cfg.vocab_size),
        "dtype": _hf_dtype(cfg),
    }
    layers: list[LayerSpec] = []

    if mt in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"):
        kw["attention"] = _hf_attention(cfg, output_gate=True)  # q_proj emits q and a gate
        kw["gdn"] = GDNDims(
            int(cfg.linear_num_key_heads),
            int(cfg.linear_num_value_heads),
            int(cfg.linear_key_head_dim),
            int(cfg.linear_value_head_dim),
            int(cfg.linear_conv_kernel_dim),
        )
        num_experts = int(_cfg_get(cfg, "num_experts", 0))
        if num_experts > 0:
            kw["moe"] = MoEDims(
                num_experts,
                int(cfg.num_experts_per_tok),
                int(cfg.moe_intermediate_size),
                int(_cfg_get(cfg, "shared_expert_intermediate_size", 0)),
            )
        if getattr(cfg, "intermediate_size", None):
            kw["mlp"] = MLPDims(int(cfg.intermediate_size))
        mlp_only = set(_cfg_get(cfg, "mlp_only_layers", []))
        step = int(_cfg_get(cfg, "decoder_sparse_step", 1))
        for i, t in enumerate(cfg.layer_types):
            mixer = MixerKind.ATTENTION if t == "full_attention" else MixerKind.GDN
            if t not in ("full_attention", "linear_attention"):
                raise ValueError(f"{mt}: layer {i} has unsupported layer type {t!r}")
            is_moe = num_experts > 0 and i not in mlp_only and (i + 1) % step == 0
            layers.append(LayerSpec(i, mixer, FFNKind.MOE if is_moe else FFNKind.MLP))

    elif mt == "nemotron_h":
        kw["attention"] = _hf_attention(cfg)
        kw["mamba2"] = Mamba2Dims(
            int(cfg.mamba_num_heads),
            int(cfg.mamba_head_dim),
            int(cfg.ssm_state_size),
            int(cfg.n_groups),
            int(cfg.conv_kernel),
        )
        kw["state_dtype"] = canonical_dtype(_cfg_get(cfg, "mamba_ssm_cache_dtype", "float32"))
        types = list(cfg.layers_block_type)
        if "mlp" in types:
            kw["mlp"] = MLPDims(int(cfg.intermediate_size), gated=False)  # relu2 up/down
        if "moe" in types:
            # Experts and shared expert are ungated (up/down). moe_latent_size (experts run in a
            # smaller latent space) is not modelled: FLOPs are an upper estimate there.
            kw["moe"] = MoEDims(
                int(cfg.n_routed_experts),
                int(cfg.num_experts_per_tok),
                int(cfg.moe_intermediate_size),
                int(cfg.moe_shared_expert_intermediate_size) * int(_cfg_get(cfg, "n_shared_experts", 1)),
                gated=False,
            )
        table = {
            "linear_attention": (MixerKind.MAMBA2, FFNKind.NONE),
            "full_attention": (MixerKind.ATTENTION, FFNKind.NONE),
            "mlp": (MixerKind.NONE, FFNKind.MLP),
            "moe": (MixerKind.NONE, FFNKind.MOE),
        }
        for i, t in enumerate(types):
            if t not in table:
                raise ValueError(f"{mt}: layer {i} has unsupported block type {t!r}")
            layers.append(LayerSpec(i, *table[t]))

    elif mt in ("bamba", "granitemoehybrid"):
        kw["attention"] = _hf_attention(cfg)
        kw["mamba2"] = _hf_mamba2(cfg, int(cfg.mamba_expand) * d)
        ffn = FFNKind.MLP
        if mt == "bamba":
            kw["mlp"] = MLPDims(int(cfg.intermediate_size))
        elif int(_cfg_get(cfg, "num_local_experts", 0)) > 0:
            # Granite: routed experts use intermediate_size; shared_mlp is always on.
            kw["moe"] = MoEDims(
                int(cfg.num_local_experts),
                int(cfg.num_experts_per_tok),
                int(cfg.intermediate_size),
                int(cfg.shared_intermediate_size),
            )
            ffn = FFNKind.MOE
        else:
            kw["mlp"] = MLPDims(int(cfg.shared_intermediate_size))
        for i, t in enumerate(cfg.layers_block_type):
            layers.append(LayerSpec(i, _layer_kind(str(t), mt, i), ffn))

    elif mt == "falcon_h1":
        # Every layer runs attention and Mamba2 in parallel on the same input.
        kw["attention"] = _hf_attention(cfg)
        d_ssm = getattr(cfg, "mamba_d_ssm", None)
        kw["mamba2"] = _hf_mamba2(cfg, int(d_ssm) if d_ssm else int(cfg.mamba_expand) * d)
        kw["mlp"] = MLPDims(int(cfg.intermediate_size))
        for i in range(int(cfg.num_hidden_layers)):
            layers.append(LayerSpec(i, MixerKind.HYBRID_PARALLEL, FFNKind.MLP))

    elif mt == "jamba":
        kw["attention"] = _hf_attention(cfg)
        d_inner = int(cfg.mamba_expand) * d
        dt_rank = cfg.mamba_dt_rank
        if not isinstance(dt_rank, int):  # "auto"
            dt_rank = math.ceil(d / 16)
        kw["mamba1"] = Mamba1Dims(d_inner, int(cfg.mamba_d_state), int(cfg.mamba_d_conv), int(dt_rank))
        experts = list(cfg.layers_num_experts)
        if any(e <= 1 for e in experts):
            kw["mlp"] = MLPDims(int(cfg.intermediate_size))
        if any(e > 1 for e in experts):
            kw["moe"] = MoEDims(int(cfg.num_experts), int(cfg.num_experts_per_tok), int(cfg.intermediate_size), 0)
        for i, t in enumerate(cfg.layers_block_type):
            mixer = MixerKind.ATTENTION if t == "attention" else MixerKind.MAMBA1
            layers.append(LayerSpec(i, mixer, FFNKind.MOE if experts[i] > 1 else FFNKind.MLP))

    elif mt == "lfm2":
        kw["attention"] = _hf_attention(cfg)
        kw["short_conv"] = ShortConvDims(int(cfg.conv_L_cache))
        kw["mlp"] = MLPDims(_lfm2_ffn_dim(cfg))
        for i, t in enumerate(cfg.layer_types):
            if t not in ("full_attention", "conv"):
                raise ValueError(f"{mt}: layer {i} has unsupported layer type {t!r}")
            mixer = MixerKind.ATTENTION if t == "full_attention" else MixerKind.SHORT_CONV
            layers.append(LayerSpec(i, mixer, FFNKind.MLP))

    else:
        raise ValueError(
            f"unsupported architecture {mt!r} for ModelGeometry.from_hf_config; supported: "
            "qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, qwen3_next, nemotron_h, "
            "bamba, jamba, falcon_h1, granitemoehybrid, lfm2"
        )
    kw["layers"] = tuple(layers)
    return kw
