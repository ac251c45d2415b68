"""A tiny hybrid model as vLLM 0.33.0 sees it, on CPU: a real ``VllmConfig`` (the model
inspected by vLLM's registry from a local ``config.json``), the layers' KV cache specs as
vLLM's own layers build them (state shapes from the model class), the ``KVCacheConfig``
from vLLM's planner, and the paged CPU buffers vLLM's own ``allocate_kv_cache`` makes for
it (``buffers``: per-layer ``[B, H, N, C]`` views of one allocation all groups
alias)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402

BLOCK = 32
BACKEND = "FLASH_ATTN"  # the attention backend the harness's buffers are laid out for
LAYOUT = "LBNHC"  # the KVCacheLayout vLLM resolves for it (layer-outer, NHD inside a block)


def tiny_nemotron_h(root: Path) -> Path:
    """A Nemotron-H config directory: layers M * M - (Mamba2, attention, Mamba2, MLP)."""
    from transformers import NemotronHConfig

    c = NemotronHConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        hybrid_override_pattern="M*M-", num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16,
                        n_groups=1, conv_kernel=4, chunk_size=16, max_position_embeddings=4096)
    c.architectures = ["NemotronHForCausalLM"]
    d = root / "nemotron_h"
    c.save_pretrained(d)
    return d


def tiny_qwen3_next(root: Path) -> Path:
    """A Qwen3-Next config directory (the GDN + gated attention layers Qwen3.5 is built
    from; vLLM's Qwen3.5 module imports torchvision, which has no build for this CPU torch):
    layers GDN, GDN, GDN, attention."""
    from transformers import Qwen3NextConfig

    c = Qwen3NextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32,
                        layer_types=["linear_attention"] * 3 + ["full_attention"],
                        max_position_embeddings=4096)
    c.architectures = ["Qwen3NextForCausalLM"]
    d = root / "qwen3_next"
    c.save_pretrained(d)
    return d


def tiny_mamba2(root: Path) -> Path:
    """A pure Mamba2 config directory (no attention: a state-only cache)."""
    from transformers import Mamba2Config

    c = Mamba2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32,
                     state_size=16, n_groups=1, conv_kernel=4, expand=2, chunk_size=16)
    c.architectures = ["Mamba2ForCausalLM"]
    d = root / "mamba2"
    c.save_pretrained(d)
    return d


MODELS = {"nemotron_h": tiny_nemotron_h, "qwen3_next": tiny_qwen3_next, "mamba2": tiny_mamba2}


def vllm_config(model_dir: Path, yaml_path: Path | None, *, extra: dict[str, Any] | None = None,
                policy: str = "recompute", num_blocks: int = 64, max_len: int = 512,
                retention: int | None = 0, tp: int = 1, layout: str = LAYOUT) -> Any:
    """``retention``: vLLM's ``prefix_cache_retention_interval`` (0, its default: only the
    "semantic" boundaries such as a prompt's end are kept and offered to connectors; N: also
    every N tokens; None: every block boundary). ``layout``: the ``KVCacheLayout`` the engine
    core resolved (``vllm_buffers.hybrid_layouts`` lists those vLLM resolves per backend)."""
    from vllm.config import (
        CacheConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    ex: dict[str, Any] = {"config_file": str(yaml_path)} if yaml_path else {}
    ex.update(extra or {})
    ktc = KVTransferConfig(**json.loads(json.dumps({
        "kv_connector": "HybridConnector",
        "kv_connector_module_path": "hybrid_connector.integrations.vllm",
        "kv_role": "kv_both", "kv_load_failure_policy": policy,
        "kv_connector_extra_config": ex})))
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32",
                     max_model_len=max_len)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cc.kv_cache_layout = layout  # what the engine core resolved (LBNHC for FlashAttention)
    cc.num_gpu_blocks = num_blocks
    cc.prefix_cache_retention_interval = retention
    sc = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=max_len,
                         is_encoder_decoder=False)
    return VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc, kv_transfer_config=ktc,
                      parallel_config=ParallelConfig(tensor_parallel_size=tp))


def layer_specs(vc: Any) -> dict[str, Any]:
    """``{layer name: KVCacheSpec}`` as vLLM's attention and Mamba layers build them, per
    TP rank (state shapes from the model class's ``MambaStateShapeCalculator``)."""
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum as Backends
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mc = vc.model_config
    cls, _ = ModelRegistry.resolve_model_cls(mc.architectures, mc)
    shapes = cls.get_mamba_state_shape_from_config(vc)
    dtypes = cls.get_mamba_state_dtype_from_config(vc)
    hf = mc.hf_text_config
    mamba_type = Backends.GDN_ATTN if "Qwen3Next" in mc.architectures[0] else Backends.MAMBA2
    tp = vc.parallel_config.tensor_parallel_size
    kinds = (getattr(hf, "layers_block_type", None) or getattr(hf, "layer_types", None)
             or ["mamba"] * hf.num_hidden_layers)  # a pure SSM: every layer a Mamba layer
    has_attn = any(k in ("attention", "full_attention") for k in kinds)
    attn = FullAttentionSpec(block_size=BLOCK, num_kv_heads=hf.num_key_value_heads // tp,
                             head_size=hf.head_dim, dtype=torch.float32) if has_attn else None
    state = sum(torch.Size(s).numel() * d.itemsize for s, d in zip(shapes, dtypes, strict=True))
    assert attn is None or attn.page_size_bytes >= state, "raise BLOCK: vLLM pads the state page"
    out: dict[str, Any] = {}
    for i, kind in enumerate(kinds):
        if kind in ("attention", "full_attention"):
            assert attn is not None
            out[f"model.layers.{i}.mixer.attn"] = attn
        elif kind in ("mamba", "linear_attention"):
            out[f"model.layers.{i}.mixer"] = MambaSpec(
                block_size=BLOCK, shapes=tuple(shapes), dtypes=tuple(dtypes),
                page_size_padded=attn.page_size_bytes if attn else None, mamba_type=mamba_type,
                mamba_cache_mode="align")
    return out


def kv_cache_config(vc: Any, num_blocks: int = 64) -> Any:
    """vLLM's planner over :func:`layer_specs` for ``num_blocks`` blocks."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

    specs = layer_specs(vc)
    page = max(s.page_size_bytes for s in specs.values())
    groups = get_global_kv_cache_groups(vc, [specs])
    per_block = page * max(len(g.layer_names) for g in groups) * len(groups)
    (cfg,) = get_kv_cache_configs(vc, [specs], [per_block * num_blocks], groups)
    return cfg


def allocate(cfg: Any, seed: int = 0, backend: str = BACKEND, layout: str = LAYOUT) -> dict[str, Any]:
    """``register_kv_caches``'s argument for ``cfg`` as vLLM's GPU model runner makes it (its
    own ``allocate_kv_cache``, on CPU; see ``buffers``), the backing bytes random."""
    import vllm_buffers as vb

    return vb.allocate(cfg, layout, vb.backend_class(backend), seed)
