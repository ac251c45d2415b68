"""Models whose attention cache the connector cannot hold are refused when the runtime is
created, with the architecture, the layer and the reason, not later in packing.

* multi-head latent attention (Bailing hybrid, DeepSeek-style): the cache layer holds K and
  V of different head sizes (transformers caches the compressed latent as "keys" and the
  rope key as "values"); only Kimi Linear's is mapped (its exactness is in test_exact.py),
  and a hand-written geometry that does not say so (no ``v_head_dim``) is refused;
* indexed attention (DSA: GLM-5-Next, Qwen4-Exp, DeepSeek-V3.2): the cache layer also holds
  indexer keys, which the connector neither saves nor restores.

Tiny configs of the real transformers classes; a hand-written geometry stands in for the
path where ``ModelGeometry.from_hf_config`` is bypassed (``HFRuntime(model, cache)`` over a
geometry from YAML), which the adapter must refuse on its own.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hf_support import config, memory_store

from hybrid_connector import assemble
from hybrid_connector.geometry.model import (
    AttentionDims,
    FFNKind,
    GDNDims,
    LayerSpec,
    MixerKind,
    MLPDims,
    ModelGeometry,
)
from hybrid_connector.integrations.hf.runtime import HFRuntime
from hybrid_connector.integrations.hf.state import HFStateAdapter

_SMALL: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2, "num_experts": 4, "num_experts_per_tok": 2,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}  # fmt: skip


def _tiny(cls_name: str, **kw: Any) -> Any:
    import transformers
    from transformers import AutoModelForCausalLM

    cfg = getattr(transformers, cls_name)(**{**_SMALL, "num_hidden_layers": 4, **kw})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _kimi_linear() -> Any:
    """MLA attention at layer 3 (caches a 16-wide latent as keys, an 8-wide rope key as
    values), KDA linear attention elsewhere."""
    return _tiny("KimiLinearConfig", kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                 qk_nope_head_dim=16, v_head_dim=16, linear_head_dim=16, linear_num_heads=4,
                 num_local_experts=4)


def _bailing_hybrid() -> Any:
    """MLA attention at layer 3 (K and V head sizes differ), linear attention elsewhere."""
    return _tiny("BailingHybridConfig", kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                 qk_nope_head_dim=16, v_head_dim=16, head_dim=16, layer_group_size=4)


def _qwen4_exp() -> Any:
    """Indexed (DSA) attention at layer 3, Gated DeltaNet elsewhere."""
    return _tiny("Qwen4ExpTextConfig", head_dim=16, linear_num_key_heads=2,
                 linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                 indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8,
                 indexer_compress_ratio=2, hc_lowrank=8, ngram_vocab_size_base=1000,
                 split_ngram_parts=4)


def _hand_geometry(model: Any) -> ModelGeometry:
    """What a user would write for these models without from_hf_config (a geometry whose
    bytes match the model's cache): attention where the config says full or indexed
    attention (Kimi's latent counted as one 16-wide KV head), a GDN-like recurrent layer
    (KDA or Gated DeltaNet: q/k/v conv and a per-head k x v state) elsewhere."""
    cfg = model.config
    kinds = [MixerKind.GDN if t == "linear_attention" else MixerKind.ATTENTION
             for t in cfg.layer_types]
    if cfg.model_type == "kimi_linear":
        attn, gdn = AttentionDims(4, 1, 16), GDNDims(4, 4, 16, 16, 4)
    else:
        attn, gdn = AttentionDims(4, 4, 16), GDNDims(2, 2, 16, 16, 4)
    return ModelGeometry(
        name="hand-written", architecture=str(cfg.model_type), hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size, dtype="float32",
        layers=tuple(LayerSpec(i, k, FFNKind.MLP) for i, k in enumerate(kinds)),
        attention=attn, gdn=gdn, mlp=MLPDims(128),
    )


@pytest.mark.parametrize(("build", "arch", "why"), [
    (_kimi_linear, "kimi_linear", r"layer 3 caches V of 1 x 8 .* give the geometry's attention a v_head_dim"),
    (_qwen4_exp, "qwen4_exp_text", r"layer 3 is indexed attention .*indexer keys"),
])  # fmt: skip
def test_runtime_refuses_at_construction(build: Any, arch: str, why: str) -> None:
    """Before the fix the runtime was built and the first prefill failed in packing (MLA) or
    silently dropped the indexer keys (indexed attention)."""
    model = build()
    geometry = _hand_geometry(model)
    with pytest.raises(ValueError, match=rf"\({arch}\): {why}"):
        HFStateAdapter(model, geometry)
    with pytest.raises(ValueError, match=rf"\({arch}\): {why}"):
        HFRuntime(model, assemble.cache(config(), geometry, memory_store()))


@pytest.mark.parametrize(("build", "arch", "layer"), [
    (lambda: _bailing_hybrid(), "bailing_hybrid", 3), (_qwen4_exp, "qwen4_exp_text", 3),
])  # fmt: skip
def test_create_refuses_from_config(build: Any, arch: str, layer: int) -> None:
    """``HFRuntime.create`` derives the geometry from the config and refuses there."""
    with pytest.raises(ValueError, match=rf"^{arch}: layer {layer} is "):
        HFRuntime.create(build(), config(), memory_store())


def test_create_refuses_zamba_by_name() -> None:
    """Zamba (v1): shared attention beside a multi-head Mamba (v1) mixer, whose per-head
    state the geometry has no layout for; refused at create, naming the architecture."""
    import transformers
    from transformers import AutoModelForCausalLM

    small = {k: v for k, v in _SMALL.items() if k not in ("layer_types", "num_experts",
                                                          "num_experts_per_tok")}
    cfg = transformers.ZambaConfig(**small, num_hidden_layers=4, attn_layer_period=2,
                                   attn_layer_offset=1, mamba_d_state=8, n_mamba_heads=2,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match=r"^zamba: not supported: .*multi-head Mamba \(v1\)"):
        HFRuntime.create(model, config(), memory_store())


def test_a_model_without_decoder_layers_is_refused_by_class() -> None:
    """Decoder layers are looked for under model.language_model, model and backbone."""
    from hybrid_connector.integrations.hf.state import decoder_base

    class Headless(torch.nn.Module):
        pass

    with pytest.raises(ValueError, match=r"^Headless: no decoder layers .*backbone\.layers"):
        decoder_base(Headless())
