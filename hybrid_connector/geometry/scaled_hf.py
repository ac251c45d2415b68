"""``config.json`` for a (scaled) geometry, and what vLLM 0.33's own code computes from it.

:func:`write_hf_config` writes a transformers config directory that both transformers
(``AutoModelForCausalLM.from_config``) and vLLM's registry load: Nemotron-H through
``NemotronHConfig`` (``hybrid_override_pattern`` M / * / -), Qwen3.5 through
``Qwen3NextConfig`` (the same GDN and gated-attention layers; vLLM's Qwen3.5 module imports
torchvision, which this CPU torch cannot). FFNs are dense MLPs, but for Qwen3-Next's last
layer: vLLM's Qwen3-Next refuses a model without a MoE layer (``set_moe_parameters``), so
that one is a single-expert MoE with a shared expert (FFNs do not shape the cache).

:func:`vllm_pages` reads the per-layer pages vLLM sizes its block from (the model class's
``get_mamba_state_shape_from_config`` in a ``MambaSpec``, a one-token ``FullAttentionSpec``);
:func:`vllm_block_size` builds the model's layers in a fresh process (vLLM's
``initialize_model``, no weights loaded) and runs the platform's
``update_block_size_for_backend`` as the executor does after ``load_model``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

from hybrid_connector.geometry.model import FFNKind, MixerKind, ModelGeometry

__all__ = ["hf_config", "vllm_block_size", "vllm_pages", "write_hf_config"]

_NEMOTRON = {(MixerKind.MAMBA2, FFNKind.NONE): "mamba", (MixerKind.ATTENTION, FFNKind.NONE): "attention",
             (MixerKind.NONE, FFNKind.MLP): "mlp"}  # hybrid_override_pattern M / * / -
_QWEN = {MixerKind.GDN: "linear_attention", MixerKind.ATTENTION: "full_attention"}


def hf_config(geom: ModelGeometry, *, max_position_embeddings: int = 1 << 17) -> Any:
    """The transformers config of ``geom`` (a Nemotron-H or Qwen3.5-style geometry, as
    ``geometry_scaled`` and the presets make them). Raises ValueError for another layout."""
    import transformers

    a, d = geom.attention, geom.to_dict()
    if a is None or geom.mlp is None:
        raise ValueError(f"{geom.name}: needs attention and a dense MLP")
    common: dict[str, Any] = {"vocab_size": geom.vocab_size, "hidden_size": geom.hidden_size,
              "num_attention_heads": a.num_heads, "num_key_value_heads": a.num_kv_heads,
              "head_dim": a.head_dim, "intermediate_size": geom.mlp.intermediate_size,
              "max_position_embeddings": max_position_embeddings, "tie_word_embeddings": False,
              "dtype": geom.dtype}
    if geom.mamba2 is not None and not geom.mlp.gated:
        m = geom.mamba2
        try:
            kinds = [_NEMOTRON[(x.mixer, x.ffn)] for x in geom.layers]
        except KeyError:
            raise ValueError(f"{geom.name}: Nemotron-H layers are mamba2, attention or mlp alone") from None
        cfg: Any = transformers.NemotronHConfig(
            **common, layers_block_type=kinds,
            mamba_num_heads=m.num_heads, mamba_head_dim=m.head_dim, ssm_state_size=m.d_state,
            n_groups=m.n_groups, conv_kernel=m.conv_kernel, chunk_size=16,
            mamba_ssm_cache_dtype=geom.state_dtype)
        cfg.architectures = ["NemotronHForCausalLM"]
        return cfg
    if geom.gdn is not None and geom.mlp.gated and a.output_gate:
        g = geom.gdn
        if any(x.ffn != FFNKind.MLP or x.mixer not in _QWEN for x in geom.layers):
            raise ValueError(f"{geom.name}: Qwen3.5 layers are gdn+mlp or attention+mlp")
        n = len(d["layers"])
        cfg = transformers.Qwen3NextConfig(
            **common, num_hidden_layers=n, layer_types=[_QWEN[x.mixer] for x in geom.layers],
            linear_num_key_heads=g.num_k_heads, linear_num_value_heads=g.num_v_heads,
            linear_key_head_dim=g.head_k_dim, linear_value_head_dim=g.head_v_dim,
            linear_conv_kernel_dim=g.conv_kernel, mlp_only_layers=list(range(n - 1)),
            num_experts=1, num_experts_per_tok=1, moe_intermediate_size=geom.mlp.intermediate_size,
            shared_expert_intermediate_size=geom.mlp.intermediate_size)
        cfg.mamba_ssm_dtype = geom.state_dtype  # what Qwen3.5's config.json says (fp32)
        cfg.architectures = ["Qwen3NextForCausalLM"]
        return cfg
    raise ValueError(f"{geom.name}: no config writer for architecture {geom.architecture!r}")


def write_hf_config(geom: ModelGeometry, directory: str | Path) -> Path:
    """Write ``geom``'s ``config.json`` into ``directory`` (created); returns it."""
    out = Path(directory)
    hf_config(geom).save_pretrained(out)
    return out


def _vllm_config(model_dir: str | Path, block_size: int, dtype: str, ssm_dtype: str) -> Any:
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype=cast(Any, dtype),
                     max_model_len=4096)
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=True,
                     mamba_ssm_cache_dtype=ssm_dtype)  # type: ignore[arg-type]
    sc = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=4096,
                         is_encoder_decoder=False)
    return VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc,
                      device_config=DeviceConfig("cpu"), load_config=LoadConfig(load_format="dummy"))


def vllm_pages(model_dir: str | Path, *, dtype: str = "float32", ssm_dtype: str = "float32"
               ) -> tuple[int, int]:
    """``(state page, KV page per token)`` of one layer as vLLM sizes them for the model in
    ``model_dir`` (model dtype ``dtype``, recurrent state ``ssm_dtype``): the page sizes
    ``Platform._align_hybrid_block_size`` divides."""
    import torch
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    vc = _vllm_config(model_dir, 32, dtype, ssm_dtype)
    mc = vc.model_config
    cls: Any = ModelRegistry.resolve_model_cls(mc.architectures, mc)[0]
    state = MambaSpec(shapes=cls.get_mamba_state_shape_from_config(vc),
                      dtypes=cls.get_mamba_state_dtype_from_config(vc), block_size=-1)
    kv = FullAttentionSpec(block_size=1, num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
                           head_size=mc.get_head_size(), dtype=getattr(torch, dtype))
    return int(state.page_size_bytes), int(kv.page_size_bytes)


def _block_sizes_here(model_dirs: list[str], block_size: int) -> list[dict[str, Any]]:
    """Runs in a fresh process: per model, build its layers, then vLLM's own alignment."""
    import tempfile

    import torch
    from vllm.config.vllm import set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform

    out = []
    for model_dir in model_dirs:
        vc = _vllm_config(model_dir, block_size, "float32", "float32")
        cc = vc.cache_config
        with tempfile.TemporaryDirectory() as tmp, set_current_vllm_config(vc):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{tmp}/dist")
            initialize_model_parallel(1, 1)
            try:
                with torch.device("cpu"):
                    initialize_model(vllm_config=vc)
                current_platform.update_block_size_for_backend(vc)
                layers = vc.compilation_config.static_forward_context.values()
                backends = sorted({x.get_attn_backend().get_name() for x in layers
                                   if hasattr(x, "get_attn_backend")})
            finally:
                destroy_model_parallel()
                destroy_distributed_environment()
        out.append({"block_size": cc.block_size, "mamba_block_size": cc.mamba_block_size,
                    "mamba_page_size_padded": cc.mamba_page_size_padded, "backends": backends})
    return out


def vllm_block_size(*model_dirs: str | Path, block_size: int = 32, timeout: float = 600
                    ) -> list[dict[str, Any]]:
    """Per model directory, the block size vLLM 0.33's platform (CPU here) computes when
    ``block_size`` is asked: ``{"block_size", "mamba_block_size", "mamba_page_size_padded",
    "backends"}``. Runs in one child process (vLLM's distributed state is process-global),
    joined before returning; raises RuntimeError if it fails."""
    code = ("import json, sys; from hybrid_connector.geometry.scaled_hf import _block_sizes_here as f; "
            "print('@@' + json.dumps(f(sys.argv[2:], int(sys.argv[1]))))")
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}
    out = subprocess.run([sys.executable, "-c", code, str(block_size), *map(str, model_dirs)],
                         capture_output=True, text=True, timeout=timeout, env=env)
    line = next((x for x in out.stdout.splitlines() if x.startswith("@@")), None)
    if out.returncode or line is None:
        raise RuntimeError(f"vLLM block-size check failed ({out.returncode}): {out.stderr[-2000:]}")
    result: list[dict[str, Any]] = json.loads(line[2:])
    return result
