"""The shipped trained tiny Nemotron-H (hybrid_connector/presets/trained_nemotron_h/: Mamba2,
attention and MLP layers): it loads, it has learnt held-out stdlib text, the cache restores
it exactly (branch-point checkpoint; after demotion through host and NVMe), and a gate
calibrated on it refuses the short replays its long Mamba2 memory does not survive."""

from __future__ import annotations

from pathlib import Path

import torch
from hf_support import (
    assert_exact_hit,
    config,
    runtime,
    small_tier_store,
)

from hybrid_connector.integrations.hf.quality import calibrate_gate
from hybrid_connector.integrations.hf.trained import (
    corpus_tokens,
    load_trained_model,
    mean_loss,
    trained_dir,
)
from hybrid_connector.runtime.suffix_replay import ReplayGate

ARCH = "nemotron_h"
N_NEW = 16
# Measured on the shipped model (rho = 1, page 16, p = 192, held-out window 1 of 256 bytes):
# 64 anchors pass the default thresholds (KL 7e-4, top-1 0.984), 16 do not (KL 0.0046 but
# top-1 0.875), where the trained Qwen3.5 is safe from 4 anchors
# (benchmarks/results/replay_quality_trained_nemotron_h.md).
SAFE_K, UNSAFE_K = 64, 16


def _text(start: int, n: int) -> list[int]:
    """``n`` held-out bytes from ``start`` (real text: the trained model's states matter)."""
    return corpus_tokens("heldout", limit=start + n)[start:].tolist()


def test_shipped_weights_are_small_hybrid_and_beat_random_on_heldout_text() -> None:
    assert (trained_dir(ARCH) / "model.safetensors").stat().st_size < 10 << 20
    model = load_trained_model(arch=ARCH)
    cfg = model.config
    assert cfg.model_type == "nemotron_h" and cfg.vocab_size == 256
    blocks = list(cfg.layers_block_type)
    assert blocks.count("linear_attention") >= 2 and blocks.count("full_attention") >= 1
    held = corpus_tokens("heldout", limit=2 * 256)
    trained = mean_loss(model, held, 256, 2)
    torch.manual_seed(0)
    random = mean_loss(type(model)(cfg).eval(), held, 256, 2)
    assert random > 5.0  # about ln 256 = 5.55
    assert trained < 2.8 and trained < random - 2.5, (trained, random)


def test_branch_point_checkpoint_on_trained_model_is_exact() -> None:
    model = load_trained_model(arch=ARCH)
    rt = runtime(model)
    prefix = _text(0, 70)
    a, b, c = prefix + _text(1000, 20), prefix + _text(2000, 20), prefix + _text(3000, 25)
    ra = rt.prefill(a)
    assert ra.info.hit_tokens == 0
    rt.decode(ra, 6)
    rt.finish(ra)
    rb = rt.prefill(b)  # speculative insertion finds the branch point at 70: checkpoint
    assert rb.info.checkpoints == (70,)
    rt.finish(rb)
    assert_exact_hit(rt, model, c, 70, N_NEW)  # states, logits, greedy tokens; closes rt


def test_trained_model_exact_after_demotion_through_host_and_nvme(tmp_path: Path) -> None:
    model = load_trained_model(arch=ARCH)
    store = small_tier_store(model, tmp_path)
    rt = runtime(model, store=store)
    prefix = _text(5000, 70)
    for start in (6000, 7000):  # the second request creates the checkpoint at the branch (70)
        r = rt.prefill(prefix + _text(start, 30))
        rt.decode(r, 4)
        rt.finish(r)
    for start in (8000, 9000, 10000):  # unrelated traffic demotes the branch's objects
        rt.finish(rt.prefill(_text(start, 60)))
    tokens = prefix + _text(11000, 21)
    plan = rt.cache.lookup(tokens, alignment=rt.alignment)
    assert plan.num_tokens == 70 and plan.exact
    assert "nvme" in {o.tier for o in plan.objects}
    assert sum(store.stats()["demotions"].values()) > 0
    assert_exact_hit(rt, model, tokens, 70, N_NEW)
    store.close()


def test_gate_calibrated_on_trained_model_admits_safe_and_refuses_unsafe_k() -> None:
    model = load_trained_model(arch=ARCH)
    rt = runtime(model, config(anchor_page_size=16, anchor_density=1.0), anchors=False)
    gate = calibrate_gate(rt, ReplayGate(max_kl=0.05, min_top1=0.9), [_text(256, 256)], [192],
                          [SAFE_K, UNSAFE_K], continuation=8)
    assert gate.passed_at(SAFE_K) and gate.admits(SAFE_K)
    assert gate.passed_at(UNSAFE_K) is False and not gate.admits(UNSAFE_K)
