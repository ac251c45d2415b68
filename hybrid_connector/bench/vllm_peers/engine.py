"""vLLM 0.33's real engine pieces on CPU for the head-to-head: a scaled hybrid model as vLLM
sees it, its ``KVCacheConfig`` from vLLM's planner, vLLM's own ``allocate_kv_cache`` buffers,
and vLLM's ``Scheduler``.

The model is a scaled preset (``geometry.scaled``: Qwen3.5-4B's or Nemotron-H's block size,
KV bytes per token and state bytes, token counts divided by ``divisor``) written as a
transformers ``config.json`` (``geometry.scaled_hf``) that vLLM's registry inspects; its
layers' cache specs are the ones vLLM's attention and Mamba/GDN layers build (state shapes
from the model class). Prefix caching runs in align mode with the block size vLLM's CPU
platform computes for the model (a multiple of 32).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

BACKEND = "FLASH_ATTN"  # the attention backend the buffers are laid out for
LAYOUT = "LBHNC"  # OffloadingConnector.get_required_kvcache_layout; the same for every peer


def write_model(preset: str, divisor: float, root: Path) -> tuple[Path, Any]:
    """The scaled ``preset``'s config directory under ``root`` and its ``ScaledGeometry``."""
    from hybrid_connector.geometry.scaled import scaled_geometry
    from hybrid_connector.geometry.scaled_hf import write_hf_config

    sg = scaled_geometry(preset, divisor)
    d = root / preset.replace(".", "_")
    write_hf_config(sg.geometry, d)
    return d, sg


def vllm_config(model_dir: Path, block: int, *, connector: dict[str, Any] | None,
                num_blocks: int, max_len: int, max_seqs: int, batched: int,
                retention: int | None = None, tp: int = 1, layout: str = LAYOUT) -> Any:
    """A real ``VllmConfig`` for the model in ``model_dir`` with ``block``-token blocks in
    align mode, ``num_blocks`` device blocks, ``retention`` as vLLM's
    ``prefix_cache_retention_interval`` (None: every block boundary kept and offered, the
    dense retention under which connectors see every state; 0, vLLM's default: only
    "semantic" boundaries such as a prompt's end), ``connector`` as the
    ``KVTransferConfig`` (None: no connector), ``tp`` tensor-parallel ranks and ``layout``
    the ``KVCacheLayout`` the engine core resolved."""
    from vllm.config import (
        CacheConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    ktc = (KVTransferConfig(**json.loads(json.dumps(connector)))
           if connector is not None else None)
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32",
                     max_model_len=max_len)
    cc = CacheConfig(block_size=block, enable_prefix_caching=True)
    cc.kv_cache_layout = layout
    cc.num_gpu_blocks = num_blocks
    cc.prefix_cache_retention_interval = retention
    sc = SchedulerConfig(max_num_batched_tokens=batched, max_num_seqs=max_seqs,
                         max_model_len=max_len, is_encoder_decoder=False)
    return VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc,
                      kv_transfer_config=ktc,
                      parallel_config=ParallelConfig(tensor_parallel_size=tp))


def layer_specs(vc: Any, block: int) -> dict[str, Any]:
    """``{layer name: KVCacheSpec}`` as vLLM's attention and Mamba/GDN layers build them, per
    TP rank (state shapes and dtypes from the model class's own calculators; a pure SSM has
    Mamba layers only). Raises ValueError when a state page does not fit the attention page
    vLLM pads it into."""
    import torch
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum as Backends
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mc = vc.model_config
    cls: Any = ModelRegistry.resolve_model_cls(mc.architectures, mc)[0]
    shapes = cls.get_mamba_state_shape_from_config(vc)
    dtypes = cls.get_mamba_state_dtype_from_config(vc)
    hf = mc.hf_text_config
    mtype = Backends.GDN_ATTN if "Qwen3Next" in mc.architectures[0] else Backends.MAMBA2
    tp = vc.parallel_config.tensor_parallel_size
    kinds: list[str] = (getattr(hf, "layers_block_type", None) or getattr(hf, "layer_types", None)
                        or ["mamba"] * hf.num_hidden_layers)  # a pure SSM: every layer Mamba
    has_attn = any(k in ("attention", "full_attention") for k in kinds)
    attn = FullAttentionSpec(block_size=block, num_kv_heads=hf.num_key_value_heads // tp,
                             head_size=hf.head_dim, dtype=torch.float32) if has_attn else None
    state = sum(torch.Size(s).numel() * d.itemsize for s, d in zip(shapes, dtypes, strict=True))
    if attn is not None and state > attn.page_size_bytes:
        raise ValueError(f"block {block} too small: vLLM pads the state page ({state} B) "
                         f"into the attention page ({attn.page_size_bytes} B)")
    out: dict[str, Any] = {}
    for i, kind in enumerate(kinds):
        if kind in ("attention", "full_attention"):
            out[f"model.layers.{i}.mixer.attn"] = attn
        elif kind in ("mamba", "linear_attention"):
            out[f"model.layers.{i}.mixer"] = MambaSpec(
                block_size=block, shapes=tuple(shapes), dtypes=tuple(dtypes),
                page_size_padded=attn.page_size_bytes if attn is not None else None,
                mamba_type=mtype, mamba_cache_mode="align")
    return out


def kv_cache_config(vc: Any, block: int, num_blocks: int) -> Any:
    """vLLM's planner (``get_kv_cache_configs``) over :func:`layer_specs` for ``num_blocks``
    device blocks."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

    specs = layer_specs(vc, block)
    page = max(s.page_size_bytes for s in specs.values())
    groups = get_global_kv_cache_groups(vc, [specs])
    per_block = page * max(len(g.layer_names) for g in groups) * len(groups)
    (cfg,) = get_kv_cache_configs(vc, [specs], [per_block * num_blocks], groups)
    return cfg


def allocate(cfg: Any) -> dict[str, Any]:
    """``register_kv_caches``'s argument as vLLM's GPU model runner makes it for ``cfg``
    (vLLM's ``allocate_kv_cache`` on a CPU device; ``buffers``)."""
    from hybrid_connector.bench.vllm_peers import buffers as vb

    return vb.allocate(cfg, LAYOUT, vb.backend_class(BACKEND), seed=1)


def make_scheduler(vc: Any, cfg: Any, block: int, async_scheduling: bool = False) -> Any:
    """vLLM's own ``Scheduler`` (it creates the connector's scheduler side from ``vc``);
    ``async_scheduling``: its ``AsyncScheduler``, what vLLM 0.33 runs by default on a GPU
    (``VllmConfig`` turns ``async_scheduling`` on unless something is incompatible): a step
    is scheduled before the previous one's output is back, so the token sampled there is a
    placeholder (``num_output_placeholders``) when the next step is planned."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    vc.scheduler_config.async_scheduling = async_scheduling
    cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(vc, cfg, StructuredOutputManager(vc), block, log_stats=True)


def make_request(rid: str, prompt: list[int], max_tokens: int, block: int,
                 stop_token_ids: list[int] | None = None, min_tokens: int = 0,
                 **fields: Any) -> Any:
    """A vLLM ``Request`` with vLLM's block hasher (sha256, as the engine core sets it up);
    it stops after ``max_tokens`` or, from its ``min_tokens``-th token on, at a token of
    ``stop_token_ids``. ``fields``: more of ``Request``'s arguments (``cache_salt``,
    ``lora_request``, ``mm_features``, ``prompt_embeds``)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=stop_token_ids,
                        min_tokens=min_tokens)
    return Request(rid, prompt, sp, None, block_hasher=get_request_block_hasher(block, sha256),
                   **fields)


def make_worker(vc: Any, cfg: Any) -> Any:
    """The connector's worker side from vLLM's factory (``vc``'s ``KVTransferConfig``)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    return KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg)
