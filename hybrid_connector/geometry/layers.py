"""Layer kinds, per-family dims, tensor specs and dtype sizes: the vocabulary of ``model``.

See ``hybrid_connector.geometry.model`` for the storage conventions (conv width ``kernel - 1``,
recurrent state in ``state_dtype``, per-rank bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import StrEnum

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
    """Attention geometry: what the KV cache holds per layer and token, ``num_kv_heads`` K
    heads of ``head_dim`` and as many V heads of ``v_head_dim`` (0: ``head_dim``).
    ``output_gate``: q_proj also emits a sigmoid gate of the same width (Qwen3.5,
    Qwen3-Next), which doubles the q projection FLOPs but not the KV. With multi-head
    latent attention (``ModelGeometry.mla``) the cache holds the compressed latent as one
    "K" head of ``kv_lora_rank`` and the shared rotary key as one "V" head of
    ``qk_rope_head_dim`` (transformers' layout), and FLOPs come from ``MLADims``."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    output_gate: bool = False
    v_head_dim: int = 0

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim


@dataclass(frozen=True)
class MLADims:
    """Multi-head latent attention (DeepSeek-V2 style, Kimi Linear): queries from
    ``q_lora_rank`` (0: a plain q projection), keys and values expanded per head from a
    ``kv_lora_rank`` latent (``qk_nope_head_dim`` + ``v_head_dim`` per head) plus one shared
    ``qk_rope_head_dim`` rotary key. Only FLOPs read it; the cache is ``AttentionDims``'."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0


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
    """Name, per-rank shape (no batch dim) and dtype name of one stored tensor.
    ``hybrid_connector.payload.layout`` places these in payloads (byte offsets, pack/unpack)."""

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


