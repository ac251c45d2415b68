"""Hand-transcribed geometries of published hybrid models, and tiny transformers configs.

The presets are typed in from the models' published ``config.json`` files (no downloads are
possible where this runs); each builder says which fields it used. ``get_preset(name)``
returns a :class:`ModelGeometry`; ``PRESETS`` lists the names.

``tiny_hf_config(arch)`` returns a small random-weight-sized transformers config of each
supported family (hidden 64, 4-8 layers mixing attention and recurrent layers) for CPU
exactness tests: ``AutoModelForCausalLM.from_config(tiny_hf_config(arch))`` builds and runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybrid_connector.model import (
    AttentionDims,
    FFNKind,
    GDNDims,
    LayerSpec,
    Mamba1Dims,
    Mamba2Dims,
    MixerKind,
    MLPDims,
    ModelGeometry,
    MoEDims,
)

__all__ = [
    "EXTRA_TINY_ARCHS",
    "PRESETS",
    "TINY_ARCHS",
    "get_preset",
    "load_geometry",
    "marconi_ref_params",
    "tiny_hf_config",
]

_A, _G, _M2, _M1, _N = (
    MixerKind.ATTENTION,
    MixerKind.GDN,
    MixerKind.MAMBA2,
    MixerKind.MAMBA1,
    MixerKind.NONE,
)


def _layers(kinds: list[tuple[MixerKind, FFNKind]]) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec(i, m, f) for i, (m, f) in enumerate(kinds))


def _interval_pattern(n: int, interval: int, ffn: FFNKind) -> tuple[LayerSpec, ...]:
    """Qwen3.5 / Qwen3-Next default: every ``interval``-th layer is full attention."""
    return _layers([(_A if (i + 1) % interval == 0 else _G, ffn) for i in range(n)])


def _nemotron_pattern(pattern: str) -> tuple[LayerSpec, ...]:
    """Nemotron-H ``hybrid_override_pattern``: M = Mamba2, * = attention, - = MLP, E = MoE."""
    table = {
        "M": (_M2, FFNKind.NONE),
        "*": (_A, FFNKind.NONE),
        "-": (_N, FFNKind.MLP),
        "E": (_N, FFNKind.MOE),
    }
    return _layers([table[c] for c in pattern])


# ---------------------------------------------------------------------------------------------
# published configs


def qwen3_5_4b() -> ModelGeometry:
    """Qwen/Qwen3.5-4B text_config: hidden 2560, 32 layers (full_attention_interval 4: 24 GDN +
    8 attention), 16 heads / 4 KV heads x 256 (gated q), GDN 16 k / 32 v heads x 128, conv 4,
    SwiGLU 9216, vocab 248320, bf16. One checkpoint: 24 x 2,146,304 B = 49.125 MiB."""
    return ModelGeometry(
        name="Qwen/Qwen3.5-4B",
        architecture="qwen3_5_text",
        hidden_size=2560,
        vocab_size=248320,
        layers=_interval_pattern(32, 4, FFNKind.MLP),
        attention=AttentionDims(16, 4, 256, output_gate=True),
        gdn=GDNDims(16, 32, 128, 128, 4),
        mlp=MLPDims(9216),
    )


def qwen3_5_0_8b() -> ModelGeometry:
    """Qwen/Qwen3.5-0.8B text_config: hidden 1024, 24 layers (18 GDN + 6 attention), 8 heads /
    2 KV heads x 256 (gated q), GDN 16 k / 16 v heads x 128, conv 4, SwiGLU 3584, vocab 248320.
    (Consistent with vLLM's 544-token mamba-aligned block reported for this model.)"""
    return ModelGeometry(
        name="Qwen/Qwen3.5-0.8B",
        architecture="qwen3_5_text",
        hidden_size=1024,
        vocab_size=248320,
        layers=_interval_pattern(24, 4, FFNKind.MLP),
        attention=AttentionDims(8, 2, 256, output_gate=True),
        gdn=GDNDims(16, 16, 128, 128, 4),
        mlp=MLPDims(3584),
    )


def qwen3_next_80b_a3b() -> ModelGeometry:
    """Qwen/Qwen3-Next-80B-A3B-Instruct: hidden 2048, 48 layers (36 GDN + 12 attention), 16
    heads / 2 KV heads x 256 (gated q), GDN 16 k / 32 v heads x 128, conv 4, every layer MoE:
    512 experts, top-10, expert 512, shared expert 512; vocab 151936, bf16."""
    return ModelGeometry(
        name="Qwen/Qwen3-Next-80B-A3B-Instruct",
        architecture="qwen3_next",
        hidden_size=2048,
        vocab_size=151936,
        layers=_interval_pattern(48, 4, FFNKind.MOE),
        attention=AttentionDims(16, 2, 256, output_gate=True),
        gdn=GDNDims(16, 32, 128, 128, 4),
        mlp=MLPDims(5120),
        moe=MoEDims(512, 10, 512, 512),
    )


NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"


def nemotron_h_8b() -> ModelGeometry:
    """nvidia/Nemotron-H-8B-Base-8K: hidden 4096, 52 blocks (24 Mamba2, 4 attention, 24 MLP)
    per ``hybrid_override_pattern``; 32 heads / 8 KV heads x 128; Mamba2 128 heads x 64,
    d_state 128, 8 groups, conv 4; relu2 (ungated) MLP 21504; vocab 131072, bf16."""
    return ModelGeometry(
        name="nvidia/Nemotron-H-8B-Base-8K",
        architecture="nemotron_h",
        hidden_size=4096,
        vocab_size=131072,
        layers=_nemotron_pattern(NEMOTRON_H_8B_PATTERN),
        attention=AttentionDims(32, 8, 128),
        mamba2=Mamba2Dims(128, 64, 128, 8, 4),
        mlp=MLPDims(21504, gated=False),
    )


def jamba_1_5_mini() -> ModelGeometry:
    """ai21labs/AI21-Jamba-1.5-Mini: hidden 4096, 32 layers, attention where i % 8 == 4 (4
    layers), Mamba (v1) elsewhere: d_inner 8192 (expand 2), d_state 16, conv 4, dt_rank 256;
    32 heads / 8 KV heads x 128; MoE (16 experts, top-2, 14336) where i % 2 == 1, dense
    SwiGLU 14336 elsewhere; vocab 65536, bf16."""
    kinds = [(_A if i % 8 == 4 else _M1, FFNKind.MOE if i % 2 == 1 else FFNKind.MLP) for i in range(32)]
    return ModelGeometry(
        name="ai21labs/AI21-Jamba-1.5-Mini",
        architecture="jamba",
        hidden_size=4096,
        vocab_size=65536,
        layers=_layers(kinds),
        attention=AttentionDims(32, 8, 128),
        mamba1=Mamba1Dims(8192, 16, 4, 256),
        mlp=MLPDims(14336),
        moe=MoEDims(16, 2, 14336, 0),
    )


def bamba_9b() -> ModelGeometry:
    """ibm-ai-platform/Bamba-9B: hidden 4096, 32 layers, attention at 9, 18, 27; Mamba2 128
    heads x 64, d_state 128, 1 group, conv 4; 32 heads / 8 KV heads x 128; SwiGLU 14336 in
    every layer; vocab 128256, bf16."""
    attn = {9, 18, 27}
    return ModelGeometry(
        name="ibm-ai-platform/Bamba-9B",
        architecture="bamba",
        hidden_size=4096,
        vocab_size=128256,
        layers=_layers([(_A if i in attn else _M2, FFNKind.MLP) for i in range(32)]),
        attention=AttentionDims(32, 8, 128),
        mamba2=Mamba2Dims(128, 64, 128, 1, 4),
        mlp=MLPDims(14336),
    )


def marconi_7b() -> ModelGeometry:
    """The 7B Attention-Mamba2 hybrid Marconi evaluates: D=4096, N=128, fp16, 24 Mamba2 + 4
    attention mixers and 28 MLPs, written Nemotron-style as 56 blocks (a mixer, then an MLP).

    Choices the reference leaves open, made to match its formulas: attention is MHA (32 x
    128, the reference ignores GQA); the MLP is ungated with I = 4D (``4*L*D*I`` = the
    reference's 16*L*D^2); Mamba2 expand 2 (128 heads x 64, 1 group, conv 4, the
    reference's conv term assumes expand 2); recurrent state kept in fp16 as the reference
    does. The true state is then 2D*N*2 bytes, twice the reference's D*N*2 (reference quirk,
    see ``ref_state_bytes``). Attention sits after mixers 3, 10, 17, 24 (evenly spaced; the
    placement changes only ``recurrent_groups``, not bytes per object or FLOPs)."""
    kinds: list[tuple[MixerKind, FFNKind]] = []
    for m in range(28):
        kinds.append((_A if m % 7 == 3 else _M2, FFNKind.NONE))
        kinds.append((_N, FFNKind.MLP))
    return ModelGeometry(
        name="marconi-7b-attn-mamba2",
        architecture="marconi_hybrid",
        hidden_size=4096,
        vocab_size=32000,
        layers=_layers(kinds),
        attention=AttentionDims(32, 32, 128),
        mamba2=Mamba2Dims(128, 64, 128, 1, 4),
        mlp=MLPDims(4 * 4096, gated=False),
        dtype="float16",
        state_dtype="float16",
    )


_BUILDERS: dict[str, Callable[[], ModelGeometry]] = {
    "qwen3.5-4b": qwen3_5_4b,
    "qwen3.5-0.8b": qwen3_5_0_8b,
    "qwen3-next-80b-a3b": qwen3_next_80b_a3b,
    "nemotron-h-8b": nemotron_h_8b,
    "jamba-1.5-mini": jamba_1_5_mini,
    "bamba-9b": bamba_9b,
    "marconi-7b": marconi_7b,
}

PRESETS: tuple[str, ...] = tuple(_BUILDERS)


def get_preset(name: str, *, tp_size: int = 1) -> ModelGeometry:
    """The preset geometry called ``name`` (case-insensitive; the HF repo id also works), at
    tensor-parallel size ``tp_size``. Unknown names raise ValueError listing the known ones."""
    key = name.strip().lower()
    builder = _BUILDERS.get(key)
    if builder is None:
        for b in _BUILDERS.values():
            g = b()
            if g.name.lower() == key:
                builder = b
                break
    if builder is None:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
    geom = builder()
    if tp_size != 1:
        geom = ModelGeometry.from_dict({**geom.to_dict(), "tp_size": tp_size}, source=f"preset {name}")
    return geom


def load_geometry(spec: str, *, tp_size: int | None = None) -> ModelGeometry:
    """Resolve a config's ``model`` value: a path to a geometry YAML (``.yaml``/``.yml`` or an
    existing file) or a preset name. ``tp_size`` overrides the loaded value when given."""
    p = Path(spec).expanduser()
    if spec.endswith((".yaml", ".yml")) or p.is_file():
        geom = ModelGeometry.from_yaml(p)
    else:
        geom = get_preset(spec)
    if tp_size is not None and tp_size != geom.tp_size:
        geom = ModelGeometry.from_dict({**geom.to_dict(), "tp_size": tp_size}, source=spec)
    return geom


def marconi_ref_params(geom: ModelGeometry) -> dict[str, int]:
    """The scalars the reference simulator's formulas take (``ref_*`` in model.py): D, N (the
    recurrent state size, Mamba d_state or GDN head_k_dim), and the layer counts n_attn, n_ssm,
    n_mlp (MoE layers count as MLP)."""
    c = geom.layer_counts()
    if geom.mamba2 is not None:
        n = geom.mamba2.d_state
    elif geom.mamba1 is not None:
        n = geom.mamba1.d_state
    elif geom.gdn is not None:
        n = geom.gdn.head_k_dim
    else:
        n = 0
    return {
        "D": geom.hidden_size,
        "N": n,
        "n_attn": c["attention"],
        "n_ssm": len(geom.recurrent_layers),
        "n_mlp": c["mlp"] + c["moe"],
    }


# ---------------------------------------------------------------------------------------------
# tiny transformers configs

TINY_ARCHS: tuple[str, ...] = (
    "qwen3_5",
    "qwen3_next",
    "nemotron_h",
    "bamba",
    "jamba",
    "falcon_h1",
    "granitemoehybrid",
)

# Also buildable, but not in TINY_ARCHS (which the hf integration tests iterate over):
# LFM2 (gated short conv + attention).
EXTRA_TINY_ARCHS: tuple[str, ...] = ("lfm2",)

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
    known = ", ".join(TINY_ARCHS + EXTRA_TINY_ARCHS)
    raise ValueError(f"unknown tiny architecture {arch!r}; known: {known}")


def tiny_hf_config(arch: str, **overrides: Any) -> Any:
    """A tiny transformers config for ``arch`` (one of :data:`TINY_ARCHS`): hidden 64, 4-6
    layers mixing attention and recurrent layers, vocab 128, fp32, eager attention, CUDA
    kernels off, so a random-weight model builds and runs a forward pass on CPU in well under a
    second. ``overrides`` replace any config field. Raises ValueError for an unknown arch."""
    import transformers

    cls_name, kwargs = _tiny_kwargs(arch)
    kwargs.update(overrides)
    cfg = getattr(transformers, cls_name)(**kwargs)
    cfg._attn_implementation = "eager"
    return cfg


__all__ += [
    "bamba_9b",
    "jamba_1_5_mini",
    "marconi_7b",
    "nemotron_h_8b",
    "qwen3_5_0_8b",
    "qwen3_5_4b",
    "qwen3_next_80b_a3b",
]
