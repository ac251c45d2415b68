"""Random-weight transformers models of a preset's real geometry, for the GPU TTFT run.

``qwen3_5_config(preset)`` turns a Qwen3.5 preset of ``hybrid_connector/presets`` (typed in
from the published ``config.json``) into a transformers ``Qwen3_5TextConfig``;
``build_model`` instantiates it with random weights straight on the target device (no
download: nothing can be fetched on the GPU machine) and checks that the runtime derives
the preset's geometry from it (``geometry_for``), so the run measures the real sizes.
``"tiny"`` is the CPU test model of ``model_tiny`` (the dry run).
"""

from __future__ import annotations

from typing import Any

import torch

from hybrid_connector.geometry.presets import get_preset, tiny_hf_config
from hybrid_connector.integrations.hf.runtime import geometry_for

_KIND = {"gdn": "linear_attention", "attention": "full_attention"}


def qwen3_5_config(preset: str, *, attn: str = "sdpa") -> Any:
    """The transformers text config of a Qwen3.5 preset (layer kinds, heads, dims, vocab)."""
    import transformers

    d = get_preset(preset).to_dict()
    if d["architecture"] != "qwen3_5_text":
        raise ValueError(f"{preset}: not a Qwen3.5 preset ({d['architecture']})")
    att, gdn = d["attention"], d["gdn"]
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["mlp"]["intermediate_size"],
        num_hidden_layers=len(d["layers"]),
        layer_types=[_KIND[layer.split("+")[0]] for layer in d["layers"]],
        num_attention_heads=att["num_heads"],
        num_key_value_heads=att["num_kv_heads"],
        head_dim=att["head_dim"],
        linear_num_key_heads=gdn["num_k_heads"],
        linear_num_value_heads=gdn["num_v_heads"],
        linear_key_head_dim=gdn["head_k_dim"],
        linear_value_head_dim=gdn["head_v_dim"],
        linear_conv_kernel_dim=gdn["conv_kernel"],
        max_position_embeddings=262144,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = attn
    return cfg


def build_model(preset: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """A random-weight causal LM of ``preset`` (or ``"tiny"``) in ``dtype`` on ``device``,
    eval mode. Raises ValueError when the runtime's geometry of it is not the preset's."""
    import transformers

    torch.manual_seed(seed)
    cfg = tiny_hf_config("qwen3_5") if preset == "tiny" else qwen3_5_config(preset)
    if device.type == "cuda":
        cfg._attn_implementation = "sdpa"  # eager attention at 32K would need 32 GB of scores
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model = model.eval()
    if preset != "tiny":
        want = get_preset(preset).fingerprint_fields()
        got = geometry_for(model).fingerprint_fields()
        if got != want:
            raise ValueError(f"{preset}: the model's geometry {got} is not the preset's {want}")
    return model
