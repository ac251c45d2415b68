"""Suffix replay on real models: exact with the full window, error shrinking with k on
long-memory models, labelled approximate hits, and the quality gate."""

from __future__ import annotations

import pytest
from hf_support import ALL_ARCHS, config, random_tokens, runtime, tiny_model

from hybrid_connector.integrations.hf.quality import calibrate_gate, measure_replay
from hybrid_connector.integrations.hf.replay import NO_REPLAY
from hybrid_connector.runtime.suffix_replay import ReplayGate, ReplayQuality

PAGE = 16


@pytest.mark.parametrize("arch", [a for a in ALL_ARCHS if a not in NO_REPLAY])
def test_replay_of_whole_prefix_is_exact(arch: str) -> None:
    """Dense anchors over [0, p) replayed from a zero state are the states of a full
    prefill (state at 0 is zero): replay itself adds no error."""
    model = tiny_model(arch, long_memory=True)
    rt = runtime(model, config(anchor_page_size=PAGE, anchor_density=1.0), anchors=False)
    toks = random_tokens(80, model.config.get_text_config().vocab_size, 3)
    (q,) = measure_replay(rt, toks, 64, [64], continuation=8)
    assert q.k == 64
    assert q.kl_max < 1e-9 and q.top1 == 1.0 and q.continuation == 1.0


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next", "bamba", "jamba", "nemotron_h"])
def test_error_shrinks_as_k_grows(arch: str) -> None:
    model = tiny_model(arch, long_memory=True)
    rt = runtime(model, config(anchor_page_size=PAGE, anchor_density=1.0), anchors=False)
    toks = random_tokens(224, model.config.vocab_size, 5)
    qs = measure_replay(rt, toks, 192, [4, 16, 64, 192], continuation=8)
    kls = [q.kl_mean for q in qs]
    assert kls[0] > 0.0, "long-memory model should not replay exactly from 4 anchors"
    for a, b in zip(kls, kls[1:], strict=False):
        assert b <= a * 1.05 + 1e-12, f"KL does not shrink with k: {kls}"
    assert kls[0] > kls[-2] > kls[-1] and kls[-1] < 1e-9


def _two_requests(arch: str, gate: ReplayGate | None) -> tuple[object, object]:
    """Request A leaves KV + anchors (its final state is at 200); request B shares A's
    first 160 tokens: no checkpoint there, so only replay can hit."""
    model = tiny_model(arch, long_memory=True)
    conf = config(replay=True, anchor_page_size=PAGE, anchor_density=0.25, chunk_size=32,
                  replay_budget_frac=0.2)
    rt = runtime(model, conf, gate=gate)
    vocab = model.config.vocab_size
    a = random_tokens(200, vocab, 8)
    ra = rt.prefill(a)
    rt.finish(ra)
    b = a[:160] + random_tokens(40, vocab, 9)
    rb = rt.prefill(b)
    rt.finish(rb)
    rt.cache.check_integrity()
    return rt, rb


@pytest.mark.parametrize("arch", ["qwen3_5", "bamba"])
def test_gate_admits_calibrated_replay_and_labels_it(arch: str) -> None:
    gate = ReplayGate(max_kl=1.0, min_top1=0.0)
    gate.record(ReplayQuality(k=1, kl_mean=0.0, kl_max=0.0, top1=1.0, continuation=1.0,
                              continuation_len=32))
    rt, rb = _two_requests(arch, gate)
    info = rb.info  # type: ignore[attr-defined]
    assert info.hit_tokens == 160 and info.replayed and not info.exact
    # The cache's replay window at p=160 with frac 0.2 is 2 pages (32 tokens).
    assert info.replay_anchors == 2 * rt.layout.keep and not info.gate_rejected  # type: ignore[attr-defined]
    assert rt.cache.stats.approx_hits == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("arch", ["qwen3_5", "bamba"])
def test_gate_rejects_replay_below_threshold(arch: str) -> None:
    model = tiny_model(arch, long_memory=True)
    conf = config(anchor_page_size=PAGE, anchor_density=0.25)
    rt = runtime(model, conf, anchors=False)
    toks = random_tokens(192, model.config.vocab_size, 8)
    # Calibrate with a threshold the measured replay misses, and one it meets.
    measured = measure_replay(rt, toks, 160, [8], continuation=8)[0]
    assert measured.kl_mean > 0
    k = measured.k
    strict_conf = config(replay_max_kl=measured.kl_mean / 2, replay_min_top1=0.0)
    lenient_conf = config(replay_max_kl=measured.kl_mean * 2, replay_min_top1=0.0)
    strict = calibrate_gate(rt, ReplayGate.from_config(strict_conf), [toks], [160], [k],
                            continuation=8)
    lenient = calibrate_gate(rt, ReplayGate.from_config(lenient_conf), [toks], [160], [k],
                             continuation=8)
    assert not strict.admits(k) and lenient.admits(k) and lenient.admits(4 * k)
    assert not lenient.admits(k - 1)  # never measured at or below k - 1
    picky = ReplayGate.from_config(config(replay_max_kl=1.0, replay_min_top1=1.0))
    picky.record(ReplayQuality(k, 0.0, 0.0, top1=0.99, continuation=1.0, continuation_len=8))
    assert not picky.admits(k)  # top-1 agreement below replay_min_top1

    rt2, rb = _two_requests(arch, strict)
    info = rb.info  # type: ignore[attr-defined]
    assert info.gate_rejected and not info.replayed and info.exact
    assert info.hit_tokens == 0  # no checkpoint at or before 160: falls back to a miss
    assert rt2.cache.stats.approx_hits == 0  # type: ignore[attr-defined]


def test_uncalibrated_gate_rejects_everything() -> None:
    gate = ReplayGate(max_kl=1.0, min_top1=0.0)
    assert not gate.admits(10_000)
    rt, rb = _two_requests("qwen3_5", None)
    assert rb.info.gate_rejected and rb.info.exact  # type: ignore[attr-defined]


@pytest.mark.parametrize("arch", ["qwen3_5", "nemotron_h", "jamba", "falcon_h1", "lfm2"])
def test_runtime_replay_over_whole_prefix_matches_full_prefill(arch: str) -> None:
    """End to end through the cache: dense anchors and a window covering the whole prefix
    make a replayed hit (labelled approximate) reproduce full prefill."""
    from hf_support import reference

    model = tiny_model(arch, long_memory=True)
    conf = config(replay=True, anchor_page_size=PAGE, anchor_density=1.0, chunk_size=32,
                  replay_budget_frac=1.0, admission="last_token")
    gate = ReplayGate(max_kl=1.0, min_top1=0.0)
    gate.record(ReplayQuality(1, 0.0, 0.0, 1.0, 1.0, 8))
    rt = runtime(model, conf, gate=gate)
    vocab = model.config.vocab_size
    a = random_tokens(100, vocab, 21)
    rt.finish(rt.prefill(a))
    b = a[:64] + random_tokens(30, vocab, 22)
    rb = rt.prefill(b)
    assert rb.info.hit_tokens == 64 and rb.info.replayed and not rb.info.exact
    ref_logits, ref_new = reference(model, b, 12)
    assert (rb.logits - ref_logits).abs().max().item() <= 1e-4
    assert rt.decode(rb, 12) == ref_new
    rt.finish(rb)
    rt.cache.check_integrity()



def test_replay_is_refused_for_zamba2() -> None:
    """Zamba2's shared attention blocks read the token embeddings, which anchors do not
    hold: a runtime with anchors, and a replay measurement, refuse it by name."""
    model = tiny_model("zamba2")
    with pytest.raises(ValueError, match=r"^zamba2: suffix replay .* token embeddings"):
        runtime(model, config(replay=True))
    rt = runtime(model, anchors=False)
    with pytest.raises(ValueError, match=r"^zamba2: suffix replay"):
        measure_replay(rt, random_tokens(40, 128, 1), 16, [16])
