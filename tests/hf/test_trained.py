"""The shipped trained tiny Qwen3.5 (hybrid_connector/presets/trained/): it loads, it has
learnt held-out stdlib text, and a gate calibrated on it admits replay where the model says
replay is safe and refuses it where it is not."""

from __future__ import annotations

import torch
from hf_support import config, runtime

from hybrid_connector.integrations.hf.quality import calibrate_gate
from hybrid_connector.integrations.hf.trained import (
    TRAINED_DIR,
    corpus_files,
    corpus_tokens,
    decode,
    encode,
    load_trained_model,
    mean_loss,
)
from hybrid_connector.runtime.suffix_replay import ReplayGate

# Measured on the shipped model (rho = 1, page 16, p = 192, held-out window 3 of 256 bytes):
# replaying 4 anchors passes the default thresholds (KL <= 0.05, top-1 >= 0.9; measured KL
# 6e-5, top-1 1.0); 1 anchor does not (KL 0.15, top-1 0.89). The trained model's recurrent
# memory is short (benchmarks/results/replay_quality_trained.md).
SAFE_K, UNSAFE_K = 4, 1


def test_byte_tokenizer_round_trips_and_splits_are_disjoint() -> None:
    text = "def f(x):\n    return x + 1  # ok é\n"
    assert decode(encode(text)) == text and max(encode(text)) < 256
    train, held = set(corpus_files("train")), set(corpus_files("heldout"))
    assert train and held and not train & held


def test_shipped_weights_are_small_and_beat_random_on_heldout_text() -> None:
    assert (TRAINED_DIR / "model.safetensors").stat().st_size < 10 << 20
    model = load_trained_model()
    assert model.config.model_type == "qwen3_5_text" and model.config.vocab_size == 256
    held = corpus_tokens("heldout", limit=2 * 256)
    trained = mean_loss(model, held, 256, 2)
    torch.manual_seed(0)
    random = mean_loss(type(model)(model.config).eval(), held, 256, 2)
    assert random > 5.0  # about ln 256 = 5.55
    assert trained < 2.5 and trained < random - 3.0, (trained, random)


def test_gate_calibrated_on_trained_model_admits_safe_and_refuses_unsafe_k() -> None:
    model = load_trained_model()
    rt = runtime(model, config(anchor_page_size=16, anchor_density=1.0), anchors=False)
    held = corpus_tokens("heldout", limit=4 * 256)
    prompts = [held[768:1024].tolist()]
    gate = calibrate_gate(rt, ReplayGate(max_kl=0.05, min_top1=0.9), prompts, [192],
                          [SAFE_K, UNSAFE_K], continuation=8)
    assert gate.passed_at(SAFE_K) and gate.admits(SAFE_K)
    assert gate.passed_at(UNSAFE_K) is False and not gate.admits(UNSAFE_K)
