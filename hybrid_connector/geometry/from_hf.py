"""transformers config adapter for ``ModelGeometry.from_hf_config`` (duck-typed: no
transformers import needed here)."""

from __future__ import annotations

import math
from typing import Any

from hybrid_connector.geometry.layers import (
    AttentionDims,
    FFNKind,
    GDNDims,
    LayerSpec,
    Mamba1Dims,
    Mamba2Dims,
    MixerKind,
    MLADims,
    MLPDims,
    MoEDims,
    ShortConvDims,
    canonical_dtype,
)

# --------------------------------------------------------------------------------------------
# transformers config adapter (duck-typed: no transformers import needed here)

_ATTN_NAMES = frozenset({"attention", "full_attention", "attn", "*"})
_RECURRENT_NAMES = frozenset({"mamba", "linear_attention", "mamba2", "M"})


SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "nemotron_h",
    "bamba", "jamba", "falcon_h1", "granitemoehybrid", "lfm2", "lfm2_moe", "olmo_hybrid",
    "zamba2", "mamba", "mamba2", "falcon_mamba", "kimi_linear",
)  # fmt: skip

# Hybrid families transformers implements that the connector refuses, and why. (Bailing-hybrid
# is refused by :func:`refuse_unsupported_attention`: MLA without a mapped cache layout.)
_REFUSED: dict[str, str] = {
    "zamba": "its hybrid layers pair a shared attention block with a multi-head Mamba (v1) "
             "mixer whose state is [heads, d_inner / heads, d_state], a layer kind the geometry "
             "has no layout for (Zamba2 is supported)",
    "minimax": "its lightning-attention layers keep their state in MiniMaxCache.linear_cache, "
               "outside the DynamicCache linear-attention layers the adapter reads and writes",
    "recurrent_gemma": "its recurrent blocks keep their state inside the modules (no cache "
                       "object to read or write) and its attention is local (sliding window)",
}


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


_ATTENTION_LAYER_TYPES = frozenset({
    "full_attention", "attention", "sliding_attention", "chunked_attention", "indexed_attention",
    "hybrid", "hybrid_sliding",
})  # fmt: skip


def refuse_unsupported_attention(cfg: Any) -> None:
    """Raise ValueError, naming the architecture, the first such layer and why, for a config
    whose attention layers a KV chunk cannot hold, whatever the architecture:

    * indexed attention (``layer_types`` entry ``"indexed_attention"``: DSA sparse attention,
      GLM-5-Next, Qwen4-Exp, DeepSeek-V3.2): the cache layer also holds indexer keys;
    * multi-head latent attention (``kv_lora_rank``: Bailing hybrid, DeepSeek) or a V head
      size other than the QK head size (``v_head_dim``), except Kimi Linear, whose cache
      layout (latent as K, rotary key as V) the geometry maps (``_kimi_linear``).
    """
    mt = str(getattr(cfg, "model_type", ""))
    text = getattr(cfg, "text_config", None) or cfg  # multimodal wrappers: the decoder's
    types = [str(t) for t in (getattr(text, "layer_types", None) or [])]
    indexed = [i for i, t in enumerate(types) if t == "indexed_attention"]
    if indexed:
        raise ValueError(
            f"{mt}: layer {indexed[0]} is indexed attention (sparse attention with a DSA indexer; "
            f"{len(indexed)} such layers): its cache also holds indexer keys, which KV chunks "
            "neither save nor restore; not supported")
    if mt == "kimi_linear":  # MLA with its cache layout mapped (see _kimi_linear)
        return
    lora = getattr(text, "kv_lora_rank", None)
    v_dim = getattr(text, "v_head_dim", None)
    qk_dim = getattr(text, "qk_head_dim", None)
    if qk_dim is None and getattr(text, "qk_nope_head_dim", None) is not None:
        qk_dim = int(text.qk_nope_head_dim) + int(_cfg_get(text, "qk_rope_head_dim", 0))
    if qk_dim is None:
        qk_dim = getattr(text, "head_dim", None)
    why = []
    if lora:
        why.append(f"multi-head latent attention, kv_lora_rank={lora}")
    if v_dim is not None and qk_dim is not None and int(v_dim) != int(qk_dim):
        why.append(f"QK head size {qk_dim} != V head size {v_dim}")
    if why:
        first = next((i for i, t in enumerate(types) if t in _ATTENTION_LAYER_TYPES), 0)
        raise ValueError(
            f"{mt}: layer {first} is attention whose K and V head sizes differ ({'; '.join(why)}):"
            " only Kimi Linear's cache layout for that is mapped (latent as K, rotary key as V);"
            " not supported")


def _kimi_linear(cfg: Any, kw: dict[str, Any], layers: list[LayerSpec]) -> None:
    """Kimi Linear: MLA attention layers, whose cache holds the ``kv_lora_rank`` latent as
    one K head and the ``qk_rope_head_dim`` rotary key as one V head, and KDA layers (Kimi
    Delta Attention: a Gated DeltaNet with per-channel decay, so its state is GDN's: one
    causal conv over q, k, v of ``linear_num_heads x linear_head_dim`` each, and a per-head
    ``head_dim x head_dim`` fp32 state). FFN: dense MLP, or MoE with shared experts."""
    heads = int(cfg.num_attention_heads)
    kw["attention"] = AttentionDims(heads, 1, int(cfg.kv_lora_rank),
                                    v_head_dim=int(cfg.qk_rope_head_dim))
    kw["mla"] = MLADims(int(cfg.kv_lora_rank), int(cfg.qk_nope_head_dim),
                        int(cfg.qk_rope_head_dim), int(cfg.v_head_dim),
                        int(_cfg_get(cfg, "q_lora_rank", 0)))
    lh, ld = int(cfg.linear_num_heads), int(cfg.linear_head_dim)
    kw["gdn"] = GDNDims(lh, lh, ld, ld, int(cfg.linear_conv_kernel_dim))
    kw["mlp"] = MLPDims(int(cfg.intermediate_size))
    ffn_types = list(cfg.mlp_layer_types)
    if "sparse" in ffn_types:
        kw["moe"] = MoEDims(int(cfg.num_local_experts), int(cfg.num_experts_per_tok),
                            int(cfg.moe_intermediate_size),
                            int(cfg.moe_intermediate_size) * int(_cfg_get(cfg, "n_shared_experts", 0)))
    for i, (t, f) in enumerate(zip(cfg.layer_types, ffn_types, strict=True)):
        if t not in ("full_attention", "linear_attention"):
            raise ValueError(f"kimi_linear: layer {i} has unsupported layer type {t!r}")
        layers.append(LayerSpec(i, MixerKind.ATTENTION if t == "full_attention" else MixerKind.GDN,
                                FFNKind.MOE if f == "sparse" else FFNKind.MLP))


def geometry_kwargs_from_hf(cfg: Any) -> dict[str, Any]:
    """Translate one transformers config into ModelGeometry keyword arguments. Raises
    ValueError for an unsupported architecture or attention (:func:`refuse_unsupported_attention`)."""
    refuse_unsupported_attention(cfg)
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

    if mt in ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid"):
        # Qwen: q_proj emits q and a sigmoid gate; OLMo-hybrid's attention has no gate.
        kw["attention"] = _hf_attention(cfg, output_gate=mt != "olmo_hybrid")
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

    elif mt == "kimi_linear":
        _kimi_linear(cfg, kw, layers)

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

    elif mt in ("lfm2", "lfm2_moe"):
        kw["attention"] = _hf_attention(cfg)
        kw["short_conv"] = ShortConvDims(int(cfg.conv_L_cache))
        dense = int(cfg.num_hidden_layers)
        if mt == "lfm2":
            kw["mlp"] = MLPDims(_lfm2_ffn_dim(cfg))
        else:  # LFM2-MoE: the first num_dense_layers run a SwiGLU MLP, the rest routed experts
            dense = int(cfg.num_dense_layers)
            if dense > 0:
                kw["mlp"] = MLPDims(int(cfg.intermediate_size))
            kw["moe"] = MoEDims(int(cfg.num_experts), int(cfg.num_experts_per_tok),
                                int(cfg.moe_intermediate_size), 0)
        for i, t in enumerate(cfg.layer_types):
            if t not in ("full_attention", "conv"):
                raise ValueError(f"{mt}: layer {i} has unsupported layer type {t!r}")
            mixer = MixerKind.ATTENTION if t == "full_attention" else MixerKind.SHORT_CONV
            layers.append(LayerSpec(i, mixer, FFNKind.MLP if i < dense else FFNKind.MOE))

    elif mt == "zamba2":
        # "mamba" ("linear_attention") layers: a Mamba2 mixer alone. "hybrid" layers: one of num_mem_blocks shared
        # transformer blocks (attention over [hidden, embeddings], so its projections are
        # wider than hidden_size's: FLOPs are a lower estimate there, and a GeLU-gated MLP)
        # then the layer's own Mamba2 mixer. Each hybrid layer caches its own K/V (the block
        # is shared, its cache is not) and state: a HYBRID_PARALLEL layer.
        heads = int(cfg.num_attention_heads)
        kw["attention"] = AttentionDims(heads, int(_cfg_get(cfg, "num_key_value_heads", heads)),
                                        int(cfg.attention_head_dim))
        d_inner = int(cfg.mamba_expand) * d
        n_heads = int(cfg.n_mamba_heads)
        kw["mamba2"] = Mamba2Dims(n_heads, d_inner // n_heads, int(cfg.mamba_d_state),
                                  int(cfg.mamba_ngroups), int(cfg.mamba_d_conv))
        kw["mlp"] = MLPDims(int(cfg.intermediate_size))
        for i, t in enumerate(cfg.layers_block_type):  # transformers spells "mamba" as
            if t not in ("mamba", "linear_attention", "hybrid"):  # "linear_attention"
                raise ValueError(f"{mt}: layer {i} has unsupported block type {t!r}")
            layers.append(LayerSpec(i, MixerKind.HYBRID_PARALLEL, FFNKind.MLP) if t == "hybrid"
                          else LayerSpec(i, MixerKind.MAMBA2, FFNKind.NONE))

    elif mt in ("mamba", "falcon_mamba", "mamba2"):
        # Pure state-space LMs: no attention, no FFN (the mixer is the whole block); the
        # cache holds recurrent state only, so every hit is a checkpoint.
        if mt == "mamba2":
            kw["mamba2"] = Mamba2Dims(int(cfg.num_heads), int(cfg.head_dim), int(cfg.state_size),
                                      int(cfg.n_groups), int(cfg.conv_kernel))
            mixer = MixerKind.MAMBA2
        else:
            dt_rank = cfg.time_step_rank
            if not isinstance(dt_rank, int):  # "auto"
                dt_rank = math.ceil(d / 16)
            kw["mamba1"] = Mamba1Dims(int(cfg.intermediate_size), int(cfg.state_size),
                                      int(cfg.conv_kernel), int(dt_rank))
            mixer = MixerKind.MAMBA1
        layers = [LayerSpec(i, mixer, FFNKind.NONE) for i in range(int(cfg.num_hidden_layers))]

    elif mt in _REFUSED:
        raise ValueError(f"{mt}: not supported: {_REFUSED[mt]}")
    else:
        raise ValueError(
            f"unsupported architecture {mt!r} for ModelGeometry.from_hf_config; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    kw["layers"] = tuple(layers)
    return kw
