"""Start-up of the vLLM connector: its YAML, the model geometry, vLLM's KV cache groups
mapped onto it, and every check that must fail before serving (fail closed).

``HybridStartupError`` names what to change: HMA disabled, a mamba cache mode other than
``align``, a chunk size that is not a multiple of the block size, a geometry (from the
model's config, or the YAML's ``model``) whose KV or state bytes differ from the KV cache
vLLM allocated, an attention layer kind this connector does not move (sliding window,
MLA with different K and V head sizes), a vocabulary too large for request namespaces
(``namespace.TOKEN_BITS``), pipeline parallelism.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from math import prod
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, MambaSpec

from hybrid_connector.core.config import ENV_PATH, HybridConfig, load_config
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import load_geometry
from hybrid_connector.geometry.weights import model_identity
from hybrid_connector.integrations.vllm.namespace import TOKEN_BITS

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class HybridStartupError(RuntimeError):
    """The connector cannot serve this engine configuration (raised at construction)."""


def layer_index(name: str) -> int:
    """The decoder layer index in a vLLM layer name (``model.layers.3.self_attn.attn``)."""
    m = _LAYER.search(name)
    if m is None:
        raise HybridStartupError(f"cannot tell the decoder layer of vLLM layer {name!r}")
    return int(m.group(1))


@dataclass(frozen=True)
class Groups:
    """vLLM's KV cache groups as the connector sees them. ``attention[i]`` / ``recurrent[i]``:
    (group id, layer name) of the geometry's i-th attention / recurrent layer, in layer order;
    ``block_size``: tokens per block, the same in every group (align mode)."""

    attention: tuple[tuple[int, str], ...]
    recurrent: tuple[tuple[int, str], ...]
    recurrent_groups: tuple[int, ...]
    block_size: int
    num_groups: int


def connector_extra(vllm_config: VllmConfig) -> dict[str, Any]:
    """``--kv-transfer-config``'s ``kv_connector_extra_config`` ({} when unset)."""
    ktc = vllm_config.kv_transfer_config
    return dict(ktc.kv_connector_extra_config or {}) if ktc else {}


def config_path(vllm_config: VllmConfig) -> str | None:
    """The YAML from ``kv_connector_extra_config.config_file``, else ``HYBRID_CONNECTOR_CONFIG``."""
    return connector_extra(vllm_config).get("config_file") or os.environ.get(ENV_PATH)


def model_id_of(vllm_config: VllmConfig, config: HybridConfig) -> str:
    """The served weights' identity for the key fingerprint: a ``model_id`` in
    ``kv_connector_extra_config``, else in the YAML's ``extra_config`` (engines that share
    a remote tier across hosts state they serve the same weights), else
    ``geometry.weights.weights_id`` of vLLM's model and revision; with the digest of the
    model's configuration after vLLM's overrides (``config_digest``)."""
    mc = vllm_config.model_config
    if mc is None:
        return ""
    stated = connector_extra(vllm_config).get("model_id") or config.extra_config.get("model_id")
    load = getattr(vllm_config, "load_config", None)
    return model_identity(str(mc.model), mc.revision, mc.hf_config,
                          getattr(load, "download_dir", None), stated=stated)


def hybrid_config(vllm_config: VllmConfig) -> HybridConfig:
    """The connector's config (``ConfigError`` for a bad file)."""
    return load_config(config_path(vllm_config))


def geometry_of(vllm_config: VllmConfig, config: HybridConfig) -> ModelGeometry:
    """The geometry of the served model, per TP rank, in vLLM's cache dtypes. A ``model``
    in the YAML must agree with the one derived from the model's own config."""
    mc = vllm_config.model_config
    model_dtype = mc.dtype if isinstance(mc.dtype, torch.dtype) else torch.float16
    dtype = _dtype_name(vllm_config.cache_config.cache_dtype, model_dtype)
    ssm = vllm_config.cache_config.mamba_ssm_cache_dtype
    state_dtype = _dtype_name(ssm, torch.float32) if ssm != "auto" else None
    tp = vllm_config.parallel_config.tensor_parallel_size
    try:
        geo = ModelGeometry.from_hf_config(mc.hf_text_config, dtype=dtype, state_dtype=state_dtype,
                                           tp_size=tp)
    except ValueError as exc:
        raise HybridStartupError(f"model {mc.model!r}: {exc}") from exc
    if config.model:
        want = load_geometry(config.model, tp_size=tp)
        if (want.kv_bytes_per_token(), want.state_bytes()) != (
                geo.kv_bytes_per_token(), geo.state_bytes()):
            raise HybridStartupError(
                f"the YAML's model {config.model!r} ({want.kv_bytes_per_token()} KV B/token, "
                f"{want.state_bytes()} B/state per rank) is not the served model "
                f"{mc.model!r} ({geo.kv_bytes_per_token()} / {geo.state_bytes()})")
    return geo


def _dtype_name(name: str, fallback: torch.dtype) -> str:
    if name in ("auto", None):
        return str(fallback).removeprefix("torch.")
    return {"half": "float16", "bfloat16": "bfloat16", "float": "float32"}.get(name, name)


def check_engine(vllm_config: VllmConfig, config: HybridConfig) -> None:
    """Fail closed on engine settings the connector cannot serve exactly."""
    if vllm_config.model_config is not None and vllm_config.model_config.is_hybrid:
        if vllm_config.scheduler_config.disable_hybrid_kv_cache_manager:
            raise HybridStartupError(
                "the hybrid KV cache manager is disabled; HybridConnector needs it for hybrid "
                "models (drop --disable-hybrid-kv-cache-manager)")
        mode = vllm_config.cache_config.mamba_cache_mode
        if mode != "align":
            raise HybridStartupError(
                f"mamba_cache_mode={mode!r}: HybridConnector needs 'align' (exact states at "
                "block boundaries; enable prefix caching)")
    pp = int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1) or 1)
    if pp > 1:
        raise HybridStartupError(
            f"pipeline_parallel_size={pp}: HybridConnector stores every layer of a TP rank in "
            "one object and serves tensor parallelism only (drop --pipeline-parallel-size)")
    vocab = vllm_config.model_config.get_vocab_size() if vllm_config.model_config else 0
    if vocab > 1 << TOKEN_BITS:
        raise HybridStartupError(
            f"a vocabulary of {vocab} ids: HybridConnector keeps requests' namespaces (cache "
            f"salt, LoRA, images) apart in token ids below 2**{TOKEN_BITS}")
    bs = vllm_config.cache_config.block_size
    if bs and config.chunk_size % bs:
        raise HybridStartupError(
            f"chunk_size {config.chunk_size} (YAML) is not a multiple of vLLM's block size {bs}")


def groups_of(kv_cache_config: KVCacheConfig, geometry: ModelGeometry) -> Groups:
    """Map vLLM's groups onto the geometry and check their bytes. Raises HybridStartupError
    for a layer kind not moved here or bytes that differ from the geometry's."""
    attn: dict[int, tuple[int, str]] = {}
    rec: dict[int, tuple[int, str]] = {}
    sizes = set()
    kv_bytes = state_bytes = 0
    for g, grp in enumerate(kv_cache_config.kv_cache_groups):
        spec = grp.kv_cache_spec
        sizes.add(spec.block_size)
        for name in grp.layer_names:
            i = layer_index(name)
            if isinstance(spec, MambaSpec):
                rec[i] = (g, name)
                state_bytes += sum(prod(s) * d.itemsize for s, d in zip(spec.shapes, spec.dtypes,
                                                                        strict=True))
            elif type(spec) is FullAttentionSpec and spec.head_size_v in (None, spec.head_size):
                attn[i] = (g, name)
                kv_bytes += 2 * spec.num_kv_heads * spec.head_size * spec.dtype.itemsize
            else:
                raise HybridStartupError(
                    f"layer {name}: {type(spec).__name__} is not supported by HybridConnector "
                    "(full attention and Mamba/GDN state layers only)")
    if len(sizes) != 1:
        raise HybridStartupError(f"KV cache groups with different block sizes {sorted(sizes)}")
    if tuple(sorted(attn)) != geometry.attention_layers or (
            kv_bytes, state_bytes) != (geometry.kv_bytes_per_token(), geometry.state_bytes()):
        raise HybridStartupError(
            f"vLLM's KV cache (attention layers {sorted(attn)}, {kv_bytes} KV B/token, "
            f"{state_bytes} B/state) does not match the geometry {geometry.name} (attention "
            f"layers {list(geometry.attention_layers)}, {geometry.kv_bytes_per_token()} KV "
            f"B/token, {geometry.state_bytes()} B/state)")
    groups = tuple(sorted({g for g, _ in rec.values()}))
    return Groups(tuple(attn[i] for i in sorted(attn)), tuple(rec[i] for i in sorted(rec)),
                  groups, sizes.pop(), len(kv_cache_config.kv_cache_groups))
