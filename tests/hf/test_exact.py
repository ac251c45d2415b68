"""Exact restore: a hit restored from a checkpoint holds the KV and recurrent states of a full
prefill to the same position and gives its logits and greedy continuation, for every
supported hybrid family (tiny random-weight fp32 models)."""

from __future__ import annotations

import pytest
import torch
from hf_support import (
    ALL_ARCHS,
    DECODE_STATE_DIFFERS,
    assert_restored_exact,
    captured_restores,
    config,
    decoded_cache,
    random_tokens,
    reference,
    restored_and_twin,
    runtime,
    state_mismatches,
    tiny_model,
)

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.integrations.hf.state import HFStateAdapter, new_model_cache

TOL = 1e-4
N_NEW = 16


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_branch_point_checkpoint_is_exact(arch: str) -> None:
    model = tiny_model(arch)
    rt = runtime(model)
    vocab = model.config.get_text_config().vocab_size
    prefix = random_tokens(70, vocab, 1)
    a = prefix + random_tokens(20, vocab, 2)
    b = prefix + random_tokens(20, vocab, 3)
    c = prefix + random_tokens(25, vocab, 4)

    ra = rt.prefill(a)
    assert ra.info.hit_tokens == 0 and ra.info.exact
    new_a = rt.decode(ra, 6)
    rt.finish(ra)
    rb = rt.prefill(b)  # speculative insertion finds the branch point at 70: checkpoint
    assert rb.info.checkpoints == (70,)
    rt.finish(rb)

    with captured_restores(rt) as restored:
        rc = rt.prefill(c)
    assert rc.info.hit_tokens == 70 and rc.info.exact and not rc.info.replayed
    assert [p for p, _ in restored] == [70]
    assert_restored_exact(rt.adapter, model, c, restored[0][1], 70)
    assert rc.info.computed_tokens == len(c) - 70
    ref_logits, ref_new = reference(model, c, N_NEW)
    assert (rc.logits - ref_logits).abs().max().item() <= TOL
    assert rt.decode(rc, N_NEW) == ref_new
    rt.finish(rc)

    # A continuation of a finished request hits its final state (last decoded token).
    d = a + new_a + random_tokens(7, vocab, 5)
    with captured_restores(rt) as restored:
        rd = rt.prefill(d)
    assert rd.info.hit_tokens == len(a) + len(new_a) and rd.info.exact
    assert [p for p, _ in restored] == [rd.info.hit_tokens]
    # The state comes from decode steps, the reference from one forward: not bitwise (where
    # transformers' decode step computes another state, the reference runs the same steps).
    ref = decoded_cache(model, a, new_a) if arch in DECODE_STATE_DIFFERS else None
    assert_restored_exact(rt.adapter, model, d, restored[0][1], rd.info.hit_tokens, ref=ref)
    ref_logits, ref_new = reference(model, d, N_NEW)
    assert (rd.logits - ref_logits).abs().max().item() <= TOL
    assert rt.decode(rd, N_NEW) == ref_new
    rt.finish(rd)
    rt.cache.check_integrity()
    rt.close()


@pytest.mark.parametrize("arch", ["qwen3_5", "bamba", "jamba"])
@pytest.mark.parametrize("p", [1, 3, 17, 40])
def test_restore_at_any_boundary(arch: str, p: int) -> None:
    """Extract KV and state at p (prefill split at p), restore into a fresh cache, continue:
    equals the uninterrupted prefill, including boundaries shorter than the conv kernel."""
    model = tiny_model(arch)
    rt = runtime(model)
    toks = torch.tensor(random_tokens(48, model.config.get_text_config().vocab_size, 7))
    mc = new_model_cache(model)
    rt.run_tokens(toks[:p], mc, 0)
    kv = rt.adapter.extract_kv(mc, 0, p)
    state = rt.adapter.extract_state(mc)
    restored = rt.adapter.restore([kv], [(0, p)], p, state)
    assert_restored_exact(rt.adapter, model, toks.tolist(), restored, p, rtol=0.0)
    got = rt.run_tokens(toks[p:], restored, p)
    full = rt.run_tokens(toks, new_model_cache(model), 0)
    assert (got - full[p:]).abs().max().item() <= TOL


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_payload_sizes_match_geometry(arch: str) -> None:
    """The state payload is model.py's layout (conv kernel - 1): same bytes as geometry."""
    model = tiny_model(arch)
    geo = ModelGeometry.from_hf_config(model.config, dtype="float32")
    ad = HFStateAdapter(model, geo)
    assert ad.state_nbytes() == geo.state_bytes()
    if geo.attention_layers:
        assert ad.kv_nbytes(10) == 10 * geo.kv_bytes_per_token()


def test_adapter_rejects_wrong_geometry() -> None:
    model = tiny_model("qwen3_5")
    other = ModelGeometry.from_hf_config(tiny_model("bamba").config)
    with pytest.raises(ValueError, match="geometry says"):
        HFStateAdapter(model, other)


def test_restore_rejects_foreign_payload() -> None:
    model = tiny_model("qwen3_5")
    rt = runtime(model)
    with pytest.raises(ValueError, match="expects"):
        rt.adapter.restore([], [], 0, torch.zeros(7))
    with pytest.raises(ValueError, match="not contiguous"):
        kv = torch.zeros(rt.adapter.kv_nbytes(4) // 4)
        rt.adapter.restore([kv], [(4, 8)], 4, None)


def test_bad_input_ids() -> None:
    rt = runtime(tiny_model("qwen3_5"))
    with pytest.raises(ValueError, match="batch size 1"):
        rt.prefill(torch.zeros((2, 4), dtype=torch.long))
    with pytest.raises(ValueError, match="non-empty"):
        rt.prefill([])
    _ = config()


@pytest.mark.parametrize("arch", ["qwen3_5", "bamba", "falcon_h1"])
def test_bf16_payloads_roundtrip_bitwise(arch: str) -> None:
    """bf16 model (KV and conv in bf16, recurrent state in the model's state dtype): a
    restored cache continues bit for bit like the cache it was extracted from."""
    rt, toks, restored, twin, mc = restored_and_twin(tiny_model(arch).to(torch.bfloat16), 23, 9)
    assert not state_mismatches(rt.adapter, restored, mc, 23, rtol=0.0)
    assert torch.equal(rt.run_tokens(toks[23:], restored, 23), rt.run_tokens(toks[23:], twin, 23))
