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
from pathlib import Path
from typing import Any

from hybrid_connector.geometry import rank_dims
from hybrid_connector.geometry.flops import (
    attention_layer_flops,
    gdn_layer_flops,
    mamba1_layer_flops,
    mamba2_layer_flops,
    mla_layer_flops,
    mlp_layer_flops,
    moe_layer_flops,
    ref_attn_flops,
    ref_kv_bytes,
    ref_mamba_flops,
    ref_mlp_flops,
    ref_node_efficiency,
    ref_node_memory,
    ref_node_savings,
    ref_state_bytes,
    short_conv_layer_flops,
)
from hybrid_connector.geometry.layers import (
    AttentionDims,
    FFNKind,
    FlopBreakdown,
    GDNDims,
    LayerSpec,
    Mamba1Dims,
    Mamba2Dims,
    MixerKind,
    MLADims,
    MLPDims,
    MoEDims,
    ShortConvDims,
    TensorSpec,
    canonical_dtype,
    dtype_bytes,
)
from hybrid_connector.geometry.schema import (
    DIM_CLASSES,
    FFN_NEEDS,
    MIXER_NEEDS,
    parse_geometry,
    read_geometry_yaml,
)

__all__ = [
    "AttentionDims", "FFNKind", "FlopBreakdown", "GDNDims", "LayerSpec", "MLPDims", "Mamba1Dims",
    "Mamba2Dims", "MixerKind", "MLADims", "ModelGeometry", "MoEDims", "ShortConvDims", "TensorSpec",
    "dtype_bytes", "ref_attn_flops", "ref_kv_bytes", "ref_mamba_flops", "ref_mlp_flops",
    "ref_state_bytes", "ref_node_efficiency", "ref_node_memory", "ref_node_savings",
]


# Dims fields for which 0 means "absent" (the rest must be >= 1).
_MAY_BE_ZERO = frozenset({"shared_intermediate_size", "v_head_dim", "q_lora_rank"})
# Fields left out of ``to_dict`` (and so of the fingerprint) at their default of 0, so that
# adding them did not change the fingerprint of models that do not use them.
_OMIT_ZERO = frozenset({("attention", "v_head_dim"), ("mla", "q_lora_rank")})


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
    mla: MLADims | None = None  # multi-head latent attention: FLOPs (the cache is `attention`)
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
        for key in DIM_CLASSES:
            dims = getattr(self, key)
            if dims is None:
                continue
            for f in fields(dims):
                v = getattr(dims, f.name)
                if isinstance(v, bool):
                    continue
                floor = 0 if f.name in _MAY_BE_ZERO else 1
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
            for need in MIXER_NEEDS[MixerKind(layer.mixer)] + FFN_NEEDS[FFNKind(layer.ffn)]:
                if getattr(self, need) is None:
                    raise ValueError(
                        f"{self.name}: layer {i} ({layer.mixer.value}/{layer.ffn.value}) "
                        f"needs `{need}` dims, which are missing"
                    )
        # Fail at construction, not at first use, if the TP layout is impossible.
        rank_dims.check(self)

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

    # ---- per-rank bytes (which tensors hold them: ``hybrid_connector.payload.layout``)

    def kv_bytes_per_token(self) -> int:
        """K+V bytes of one token over all attention layers on one rank:
        ``kv_heads_per_rank * (head_dim + v_dim) * dtype_bytes`` per attention layer."""
        if "kv_bytes" not in self._memo:
            a, n = self.attention, len(self.attention_layers)
            per_layer = 0 if a is None or not n else (
                rank_dims.kv_heads_per_rank(self) * (a.head_dim + a.v_dim) * dtype_bytes(self.dtype))
            self._memo["kv_bytes"] = n * per_layer
        return int(self._memo["kv_bytes"])

    def state_bytes(self) -> int:
        """Bytes of one state checkpoint (all recurrent layers, conv + recurrent) on one rank."""
        if "state_bytes" not in self._memo:
            self._memo["state_bytes"] = sum(self.state_bytes_per_layer().values())
        return int(self._memo["state_bytes"])

    def state_bytes_per_layer(self) -> dict[int, int]:
        """Checkpoint bytes split by recurrent layer index (per rank): the conv state
        (``dtype``) plus the recurrent state (``state_dtype``) of
        ``rank_dims.state_shapes``."""
        out: dict[int, int] = {}
        for layer in self.layers:
            shapes = rank_dims.state_shapes(self, layer) if layer.mixer.is_recurrent else None
            if shapes is not None:
                rec = 0 if shapes.recurrent is None else (
                    math.prod(shapes.recurrent) * dtype_bytes(self.state_dtype))
                out[layer.index] = math.prod(shapes.conv) * dtype_bytes(self.dtype) + rec
        return out

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
        if self.mla is not None and self.attention is not None:
            acc["attention"] = counts["attention"] * mla_layer_flops(
                self.mla, self.attention.num_heads, d, n, prefix_tokens)
        elif self.attention is not None:
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
            for need in MIXER_NEEDS[layer.mixer] + FFN_NEEDS[layer.ffn]:
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
        for key, cls in DIM_CLASSES.items():
            dims = getattr(self, key)
            if dims is not None:
                out[key] = {f.name: getattr(dims, f.name) for f in fields(cls)
                            if not ((key, f.name) in _OMIT_ZERO and getattr(dims, f.name) == 0)}
        out["dtype"] = self.dtype
        out["state_dtype"] = self.state_dtype
        out["tp_size"] = self.tp_size
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "geometry") -> ModelGeometry:
        """Inverse of :meth:`to_dict`, validated by ``geometry_schema.GeometrySchema``
        (layers may also be ``{"mixer": ..., "ffn": ...}`` mappings). Raises ValueError
        naming ``source`` and the offending key for unknown keys, missing keys and bad
        values."""
        return cls._from_data(d, source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ModelGeometry:
        """Load a geometry written as the :meth:`to_dict` mapping, optionally nested under a
        top-level ``model:`` key. Errors name the file and the bad key."""
        p = Path(path)
        return cls._from_data(read_geometry_yaml(p), str(p))

    @classmethod
    def _from_data(cls, data: object, source: str) -> ModelGeometry:
        kwargs = parse_geometry(data, source)  # shape and types, per key
        try:
            return cls(**kwargs)  # what only the whole can tell (dims needed, TP layout)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from e

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
        Qwen3.5-MoE, Qwen3-Next, Nemotron-H, Bamba, Jamba, Falcon-H1, GraniteMoeHybrid, LFM2,
        LFM2-MoE, OLMo-hybrid, Zamba2, and the state-only Mamba, Mamba2, FalconMamba; see
        ``model_hf.SUPPORTED_ARCHITECTURES``).
        ``dtype`` defaults to the config's ``dtype`` (else bfloat16); ``state_dtype`` to the
        config's mamba SSM cache dtype where it has one (else float32). Raises ValueError for
        an unsupported ``model_type``, naming it (and the reason, for the hybrid families
        transformers implements that are refused: Zamba, MiniMax, RecurrentGemma, and MLA
        or indexed attention)."""
        from hybrid_connector.geometry.from_hf import geometry_kwargs_from_hf  # lazy: optional path

        kw = geometry_kwargs_from_hf(cfg)
        if name is not None:
            kw["name"] = name
        if dtype is not None:
            kw["dtype"] = dtype
        if state_dtype is not None:
            kw["state_dtype"] = state_dtype
        kw["tp_size"] = tp_size
        return cls(**kw)

