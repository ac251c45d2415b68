"""Geometries of published hybrid models (shipped as data), and tiny transformers configs.

The presets are YAML files in ``hybrid_connector/presets/`` (package data), one per preset,
typed in from the models' published ``config.json`` files (no downloads are possible where
this runs); each file's comment says which fields it used. ``presets/index.yaml`` lists
their names in order. They are read through the same schema as any user geometry
(``ModelGeometry.from_dict``), so a broken preset fails like a broken user file, naming the
file and the key. ``get_preset(name)`` returns a :class:`ModelGeometry`; ``PRESETS`` lists
the names.

``tiny_hf_config(arch)`` returns a small random-weight-sized transformers config of each
supported family (hidden 64, 4-8 layers mixing attention and recurrent layers) for CPU
exactness tests: ``AutoModelForCausalLM.from_config(tiny_hf_config(arch))`` builds and runs.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hybrid_connector.model import ModelGeometry

__all__ = [
    "EXTRA_TINY_ARCHS",
    "PRESETS",
    "TINY_ARCHS",
    "get_preset",
    "load_geometry",
    "marconi_ref_params",
    "tiny_hf_config",
]

# ---------------------------------------------------------------------------------------------
# published configs

_DIR = resources.files("hybrid_connector") / "presets"


def _read(name: str) -> Any:
    return yaml.safe_load((_DIR / name).read_text(encoding="utf-8"))


PRESETS: tuple[str, ...] = tuple(_read("index.yaml")["presets"])


@functools.cache
def _preset(key: str) -> ModelGeometry:
    """The preset ``key`` (a name in ``PRESETS``) at tp_size 1. Cached: a geometry is
    immutable (its memo only caches derived figures), so callers may share one."""
    return ModelGeometry.from_dict(_read(f"{key}.yaml"), source=str(_DIR / f"{key}.yaml"))


def get_preset(name: str, *, tp_size: int = 1) -> ModelGeometry:
    """The preset geometry called ``name`` (case-insensitive; the HF repo id also works), at
    tensor-parallel size ``tp_size``. Unknown names raise ValueError listing the known ones."""
    key = name.strip().lower()
    if key not in PRESETS:
        key = next((k for k in PRESETS if _preset(k).name.lower() == key), "")
    if not key:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
    geom = _preset(key)
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

