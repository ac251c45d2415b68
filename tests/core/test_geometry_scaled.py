"""Scaled geometries keep the real presets' cache proportions (issue 27, item 2).

The real figures come from vLLM's own page sizes for the real models' configs (written by
the same writer) and vLLM's hybrid block formula; the scaled models' block size is checked
against vLLM's own platform code on CPU for the written ``config.json``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from hybrid_connector.geometry.model import ModelGeometry  # noqa: E402
from hybrid_connector.geometry.presets import get_preset  # noqa: E402
from hybrid_connector.geometry.scaled import (  # noqa: E402
    CPU_KERNEL_ALIGNMENT,
    GPU_KERNEL_ALIGNMENT,
    cache_figures,
    cpu_exact_divisor,
    hybrid_block_size,
    scaled_geometry,
)
from hybrid_connector.geometry.scaled_hf import vllm_block_size, vllm_pages, write_hf_config  # noqa: E402
from hybrid_connector.payload.layout import kv_layout, state_layout  # noqa: E402

PRESETS = ("qwen3.5-4b", "nemotron-h-8b")
TOL = 0.01  # state bytes (and state in KV tokens) within 1% of the real ones over s
# (block, KV bytes/token, state bytes, state in KV tokens) per rank, bf16 KV, fp32 SSM state
REAL = {"qwen3.5-4b": (528, 32768, 51_511_296, 1572.0),
        "nemotron-h-8b": (1040, 16384, 102_137_856, 6234.0)}


@pytest.mark.parametrize("preset", PRESETS)
def test_real_figures_are_vllms(tmp_path: Path, preset: str) -> None:
    """The per-layer pages vLLM's own spec classes give the real configs are the preset's,
    so FlashAttention's 16-token alignment gives the issue's 528 (and Nemotron-H's 1,040)."""
    real = get_preset(preset)
    figs = cache_figures(real)
    pages = vllm_pages(write_hf_config(real, tmp_path / preset), dtype="bfloat16")
    assert pages == (figs.state_page, figs.kv_page_per_token)
    assert hybrid_block_size(*pages, GPU_KERNEL_ALIGNMENT) == figs.block_size
    assert (figs.block_size, figs.kv_bytes_per_token, figs.state_bytes, figs.state_tokens) == REAL[preset]
    if preset == "qwen3.5-4b":  # Hopper + FlashInfer GDN prefill: a 64-token checkpoint grid
        assert cache_figures(real, 64).block_size == 576


@pytest.mark.parametrize("divisor", [16, 8])
@pytest.mark.parametrize("preset", PRESETS)
def test_scaled_figures_keep_the_real_ratios(preset: str, divisor: int) -> None:
    sg = scaled_geometry(preset, divisor)
    block, kv, state, tokens = REAL[preset]
    assert sg.scaled.block_size == block // divisor  # 33 / 65 at 16, 66 / 130 at 8
    assert sg.scaled.state_tokens == pytest.approx(tokens / divisor, rel=TOL)  # ~98 / ~390 at 16
    r = sg.ratios()
    assert r["block"] == 1.0 and r["kv_bytes_per_token"] == 1.0
    assert r["state_tokens"] == pytest.approx(1.0, rel=TOL)
    assert r["state_bytes"] == pytest.approx(1.0, rel=TOL)
    # the block-driving page ratio: one state page against the block's KV page
    assert sg.scaled.page_ratio <= sg.scaled.block_size
    assert sg.scaled.page_ratio == pytest.approx(sg.real.page_ratio / divisor, rel=TOL)


@pytest.mark.parametrize("divisor", [16, 8])
def test_the_presets_keep_their_ratios_to_each_other(divisor: int) -> None:
    q, n = (scaled_geometry(p, divisor) for p in PRESETS)
    assert (q.scaled.kv_bytes_per_token / n.scaled.kv_bytes_per_token
            == q.real.kv_bytes_per_token / n.real.kv_bytes_per_token)
    assert (q.scaled.state_bytes / n.scaled.state_bytes
            == pytest.approx(q.real.state_bytes / n.real.state_bytes, rel=2 * TOL))
    assert q.scaled.block_size / n.scaled.block_size == q.real.block_size / n.real.block_size


@pytest.mark.parametrize("preset", PRESETS)
def test_layer_pattern_is_the_real_one_in_proportion(preset: str) -> None:
    real, sg = get_preset(preset), scaled_geometry(preset, 16)
    kinds = [(x.mixer, x.ffn) for x in sg.geometry.layers]
    real_kinds = [(x.mixer, x.ffn) for x in real.layers]
    assert kinds == real_kinds[: len(real_kinds) // 4]  # the pattern's first quarter
    for k in set(real_kinds):
        assert kinds.count(k) * 4 == real_kinds.count(k)
    full = scaled_geometry(preset, 16, layer_divisor=1).geometry
    assert [(x.mixer, x.ffn) for x in full.layers] == real_kinds
    with pytest.raises(ValueError, match="proportion"):
        scaled_geometry(preset, 16, layer_divisor=3)


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot scale"):
        scaled_geometry("jamba-1.5-mini", 16)
    with pytest.raises(ValueError, match="divisor"):
        scaled_geometry("qwen3.5-4b", 0.5)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_written_config_loads_in_transformers_with_the_same_cache(tmp_path: Path,
                                                                      preset: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    sg = scaled_geometry(preset, 16, vocab_size=256)
    cfg = AutoConfig.from_pretrained(write_hf_config(sg.geometry, tmp_path))
    back = ModelGeometry.from_hf_config(cfg, dtype="float32", state_dtype="float32")
    assert kv_layout(back, 1).specs == kv_layout(sg.geometry, 1).specs
    assert state_layout(back).specs == state_layout(sg.geometry).specs
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.randint(3, 256, (1, 2 * sg.scaled.block_size))).logits
    assert logits.shape == (1, 2 * sg.scaled.block_size, 256) and torch.isfinite(logits).all()


def test_vllms_own_block_size_for_the_written_configs(tmp_path: Path) -> None:
    """vLLM's CPU platform (``update_block_size_for_backend`` over the layers vLLM builds)
    rounds the hybrid block to CPU_ATTN's 32: at s = 16 the scaled Qwen3.5 gets 64 (the
    GPU-to-scale block is 33); at :func:`cpu_exact_divisor` (16.5 / 16.25) the real block
    over s is a multiple of 32 and vLLM computes exactly it."""
    cases = [(p, s) for p in PRESETS for s in (16.0, cpu_exact_divisor(p, 16))]
    assert [s for _, s in cases] == [16.0, 16.5, 16.0, 16.25]
    geoms = [scaled_geometry(p, s, vocab_size=256) for p, s in cases]
    dirs = [write_hf_config(g.geometry, tmp_path / f"{p}-{s}") for (p, s), g in zip(cases, geoms, strict=True)]
    got = vllm_block_size(*dirs, block_size=CPU_KERNEL_ALIGNMENT)
    blocks = [r["block_size"] for r in got]
    assert blocks == [g.cpu_block_size() for g in geoms] == [64, 32, 96, 64]
    assert blocks[1] == REAL["qwen3.5-4b"][0] / 16.5 and blocks[3] == REAL["nemotron-h-8b"][0] / 16.25
    for r, g in zip(got, geoms, strict=True):
        assert r["mamba_block_size"] == r["block_size"]  # align mode: one block for both
        assert r["mamba_page_size_padded"] in (None, r["block_size"] * g.scaled.kv_page_per_token)
        assert "CPU_ATTN" in r["backends"]
