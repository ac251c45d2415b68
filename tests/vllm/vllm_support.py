"""A tiny hybrid model as vLLM 0.33.0 sees it, on CPU: a real ``VllmConfig`` (the model
inspected by vLLM's registry from a local ``config.json``), the layers' KV cache specs as
vLLM's own layers build them (state shapes from the model class), the ``KVCacheConfig``
from vLLM's planner, and the paged CPU buffers vLLM's own ``allocate_kv_cache`` makes for
it (``buffers``: per-layer ``[B, H, N, C]`` views of one allocation all groups
alias)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


from hybrid_connector.bench.vllm_peers import engine as eng  # noqa: E402

BLOCK = 32
BACKEND = "FLASH_ATTN"  # the attention backend the harness's buffers are laid out for
LAYOUT = "LBNHC"  # the KVCacheLayout vLLM resolves for it (layer-outer, NHD inside a block)
#: the connector config most tests start from (a test appends its own keys)
BASE_YAML = """chunk_size: 64
hash_block_size: 32
alignment: 32
pools:
  host: {kv: 4MB, state: 2MB}
replay: false
"""
#: an NVMe tier only, under ``{dir}`` (a test appends it to the keys above its ``pools:``)
DISK_YAML = ("local_cpu: false\nlocal_disk: {dir}\nmax_local_disk_size: 8MB\ndisk_fsync: false\n"
             "pools:\n  disk: {{kv: 4MB, state: 4MB}}\n")


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
    """``engine.vllm_config`` with this project's connector (``yaml_path``, ``extra``:
    its extra config; ``policy``: vLLM's ``kv_load_failure_policy``), ``BLOCK``-token
    blocks, 8 sequences and 256 tokens per step. ``retention``: vLLM's
    ``prefix_cache_retention_interval`` (0, its default: only the "semantic" boundaries such
    as a prompt's end are kept and offered to connectors; N: also every N tokens; None: every
    block boundary). ``layout``: the ``KVCacheLayout`` the engine core resolved
    (``vllm_buffers.hybrid_layouts`` lists those vLLM resolves per backend)."""
    ex: dict[str, Any] = {"config_file": str(yaml_path)} if yaml_path else {}
    ex.update(extra or {})
    connector = {"kv_connector": "HybridConnector",
                 "kv_connector_module_path": "hybrid_connector.integrations.vllm",
                 "kv_role": "kv_both", "kv_load_failure_policy": policy,
                 "kv_connector_extra_config": ex}
    return eng.vllm_config(model_dir, BLOCK, connector=connector, num_blocks=num_blocks,
                           max_len=max_len, max_seqs=8, batched=256, retention=retention,
                           tp=tp, layout=layout)


def layer_specs(vc: Any) -> dict[str, Any]:
    """``engine.layer_specs`` at ``BLOCK``: the layers' specs per TP rank."""
    return eng.layer_specs(vc, BLOCK)


def kv_cache_config(vc: Any, num_blocks: int = 64) -> Any:
    """vLLM's planner over :func:`layer_specs` for ``num_blocks`` blocks."""
    return eng.kv_cache_config(vc, BLOCK, num_blocks)


def allocate(cfg: Any, seed: int = 0, backend: str = BACKEND, layout: str = LAYOUT) -> dict[str, Any]:
    """``register_kv_caches``'s argument for ``cfg`` as vLLM's GPU model runner makes it (its
    own ``allocate_kv_cache``, on CPU; see ``buffers``), the backing bytes random."""
    import vllm_buffers as vb

    return vb.allocate(cfg, layout, vb.backend_class(backend), seed)
