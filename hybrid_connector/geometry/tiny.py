"""Tiny transformers configs of every supported family, for CPU exactness tests.

``tiny_hf_config(arch)`` returns a small random-weight-sized config (hidden 64, 3-6 layers
mixing attention and recurrent layers, vocab 128, fp32, eager attention) and
``tiny_hf_model(arch)`` builds its model with the class real checkpoints load as:
``AutoModelForCausalLM`` for causal LMs, the ``...ForConditionalGeneration`` class for the
multimodal wrappers (:data:`MULTIMODAL_TINY_ARCHS`, a tiny vision tower included).
"""

from __future__ import annotations

from typing import Any

TINY_ARCHS: tuple[str, ...] = (
    "qwen3_5",
    "qwen3_next",
    "nemotron_h",
    "bamba",
    "jamba",
    "falcon_h1",
    "granitemoehybrid",
)

# Also buildable, hybrid (attention and recurrent layers), not in TINY_ARCHS: LFM2 and
# LFM2-MoE (gated short conv + attention), OLMo-hybrid (Gated DeltaNet + attention), Zamba2
# (Mamba2 layers; hybrid layers add a shared attention block).
EXTRA_TINY_ARCHS: tuple[str, ...] = ("lfm2", "lfm2_moe", "olmo_hybrid", "zamba2", "kimi_linear")

# Multimodal checkpoint classes (Qwen3.5 / Qwen3.5-MoE ``...ForConditionalGeneration``): the
# tiny Qwen3.5 text decoder inside the wrapper config, with a one-block vision tower.
MULTIMODAL_TINY_ARCHS: tuple[str, ...] = ("qwen3_5_vl", "qwen3_5_moe_vl")

# Pure state-space LMs: no attention layer, the cache holds recurrent state only.
SSM_TINY_ARCHS: tuple[str, ...] = ("mamba", "mamba2", "falcon_mamba")

_COMMON: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "dtype": "float32",
}


def _tiny_kwargs(arch: str) -> tuple[str, dict[str, Any]]:
    """(transformers config class name, kwargs) of the tiny config for ``arch``."""
    mamba2 = {
        "mamba_n_heads": 8,
        "mamba_d_head": 16,  # d_inner = 128 = expand 2 x hidden 64
        "mamba_n_groups": 2,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 16,
    }
    # Qwen3.5 and Qwen3-Next share the GDN/attention layout (3 linear : 1 full).
    gdn = {
        "head_dim": 16,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
    }
    if arch == "qwen3_5":
        return "Qwen3_5TextConfig", {
            **_COMMON,
            **gdn,
        }
    if arch == "qwen3_next":
        return "Qwen3NextConfig", {
            **_COMMON,
            **gdn,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "mlp_only_layers": [1],
        }
    if arch == "nemotron_h":
        return "NemotronHConfig", {
            **_COMMON,
            "head_dim": 16,
            "layers_block_type": [
                "linear_attention",
                "mlp",
                "full_attention",
                "mlp",
                "linear_attention",
                "moe",
            ],
            "intermediate_size": 128,
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 2,
            "conv_kernel": 4,
            "chunk_size": 16,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32,
        }
    if arch == "bamba":
        return "BambaConfig", {
            **_COMMON,
            **mamba2,
            "intermediate_size": 128,
            "num_hidden_layers": 5,
            "attn_layer_indices": [2],
        }
    if arch == "jamba":
        return "JambaConfig", {
            **_COMMON,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "attn_layer_period": 4,
            "attn_layer_offset": 2,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "mamba_d_state": 8,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": 8,
        }
    if arch == "falcon_h1":
        return "FalconH1Config", {
            **_COMMON,
            **mamba2,
            "head_dim": 16,
            "mamba_d_ssm": 128,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
        }
    if arch == "granitemoehybrid":
        return "GraniteMoeHybridConfig", {
            **_COMMON,
            **mamba2,
            "intermediate_size": 32,
            "shared_intermediate_size": 64,
            "num_hidden_layers": 4,
            "layer_types": ["mamba", "attention", "mamba", "mamba"],
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        }
    if arch == "lfm2":
        return "Lfm2Config", {
            **_COMMON,
            "intermediate_size": 192,  # auto-adjusted by LFM2 to 2/3 -> 128 (multiple of 64)
            "block_multiple_of": 64,
            "num_hidden_layers": 4,
            "layer_types": ["conv", "conv", "full_attention", "conv"],
            "conv_L_cache": 3,
        }
    if arch == "lfm2_moe":
        return "Lfm2MoeConfig", {
            **_COMMON,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_hidden_layers": 4,
            "num_dense_layers": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "layer_types": ["conv", "conv", "full_attention", "conv"],
            "conv_L_cache": 3,
        }
    if arch == "kimi_linear":  # MLA (16-wide latent, 8-wide rope key) at layer 2, KDA elsewhere
        return "KimiLinearConfig", {
            **_COMMON,
            "num_key_value_heads": 4,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_hidden_layers": 4,
            "layer_types": ["linear_attention", "linear_attention", "full_attention",
                            "linear_attention"],
            "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
            "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16, "v_head_dim": 16,
            "linear_head_dim": 16, "linear_num_heads": 4, "linear_conv_kernel_dim": 4,
            "num_local_experts": 4, "num_experts_per_tok": 2,
        }
    if arch == "olmo_hybrid":
        return "OlmoHybridConfig", {
            **_COMMON,
            **{k: v for k, v in gdn.items() if k not in ("head_dim", "linear_conv_kernel_dim")},
        }
    if arch == "zamba2":
        return "Zamba2Config", {
            **_COMMON,
            "num_hidden_layers": 4,
            "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
            "intermediate_size": 128,
            "num_mem_blocks": 1,
            "n_mamba_heads": 8,  # head dim 16: d_inner 128 = expand 2 x hidden 64
            "mamba_ngroups": 2,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "chunk_size": 16,
        }
    if arch in ("mamba", "falcon_mamba"):
        return "MambaConfig" if arch == "mamba" else "FalconMambaConfig", {
            **_COMMON,
            "num_hidden_layers": 3,
            "state_size": 8,
            "expand": 2,
            "conv_kernel": 4,
            "time_step_rank": 8,
        }
    if arch == "mamba2":
        return "Mamba2Config", {
            **_COMMON,
            "num_hidden_layers": 3,
            "num_heads": 8,
            "head_dim": 16,
            "state_size": 16,
            "n_groups": 2,
            "conv_kernel": 4,
            "chunk_size": 16,
        }
    known = ", ".join(TINY_ARCHS + EXTRA_TINY_ARCHS + MULTIMODAL_TINY_ARCHS + SSM_TINY_ARCHS)
    raise ValueError(f"unknown tiny architecture {arch!r}; known: {known}")


_VISION: dict[str, Any] = {
    "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
    "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16,
}  # fmt: skip


def tiny_hf_config(arch: str, **overrides: Any) -> Any:
    """A tiny transformers config for ``arch`` (one of :data:`TINY_ARCHS`,
    :data:`EXTRA_TINY_ARCHS`, :data:`MULTIMODAL_TINY_ARCHS`, :data:`SSM_TINY_ARCHS`): hidden
    64, 3-6 layers, vocab 128, fp32, eager attention, CUDA kernels off, so a random-weight
    model builds and runs a forward pass on CPU in well under a second. ``overrides`` replace
    any field of the (text) config. Raises ValueError for an unknown arch."""
    import transformers

    if arch in MULTIMODAL_TINY_ARCHS:
        moe = arch == "qwen3_5_moe_vl"
        text = tiny_hf_config("qwen3_5", **overrides).to_dict()
        text.pop("model_type", None)
        if moe:
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32)
        cls = transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config
        cfg: Any = cls(text_config=text, vision_config=dict(_VISION))
        cfg._attn_implementation = "eager"
        cfg.text_config._attn_implementation = "eager"
        return cfg
    cls_name, kwargs = _tiny_kwargs(arch)
    kwargs.update(overrides)
    cfg = getattr(transformers, cls_name)(**kwargs)
    cfg._attn_implementation = "eager"
    return cfg


def tiny_hf_model(arch: str, **overrides: Any) -> Any:
    """The random-weight model of :func:`tiny_hf_config` ``(arch, **overrides)``, in eval
    mode, built with the class real checkpoints of the family load as (the multimodal
    ``...ForConditionalGeneration`` class for :data:`MULTIMODAL_TINY_ARCHS`). Seed torch
    first for reproducible weights."""
    import transformers

    cfg = tiny_hf_config(arch, **overrides)
    if arch in MULTIMODAL_TINY_ARCHS:
        cls = (transformers.Qwen3_5MoeForConditionalGeneration if arch == "qwen3_5_moe_vl"
               else transformers.Qwen3_5ForConditionalGeneration)
        return cls(cfg).eval()
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()
