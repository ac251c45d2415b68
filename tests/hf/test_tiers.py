"""Exactness after the objects went through every tier: device -> host -> nvme (demotion)
and back (promotion on the hit), with the real TieredStore and tiers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_support import (
    ALL_ARCHS,
    assert_restored_exact,
    captured_restores,
    random_tokens,
    reference,
    runtime,
    small_tier_store,
    tiny_model,
)


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_exact_after_every_tier(arch: str, tmp_path: Path) -> None:
    model = tiny_model(arch)
    store = small_tier_store(model, tmp_path)
    rt = runtime(model, store=store)
    vocab = model.config.get_text_config().vocab_size
    prefix = random_tokens(70, vocab, 11)
    for seed in (12, 13):  # the second request creates the checkpoint at the branch (70)
        r = rt.prefill(prefix + random_tokens(30, vocab, seed))
        rt.decode(r, 4)
        rt.finish(r)
    for seed in (14, 15, 16):  # unrelated traffic: demotes the branch's objects further
        r = rt.prefill(random_tokens(60, vocab, seed))
        rt.finish(r)

    probe_tokens = prefix + random_tokens(21, vocab, 17)
    plan = rt.cache.lookup(probe_tokens, alignment=rt.alignment)
    assert plan.num_tokens == 70 and plan.exact
    tiers = {o.tier for o in plan.objects}
    assert "nvme" in tiers, f"expected objects demoted to nvme, got {tiers}"
    # Puts land in the device tier; only demotion (device -> host -> nvme) reaches nvme.
    assert sum(store.stats()["demotions"].values()) > 0

    with captured_restores(rt) as restored:
        rc = rt.prefill(probe_tokens)
    assert rc.info.hit_tokens == 70 and rc.info.exact
    assert [p for p, _ in restored] == [70]
    assert_restored_exact(rt.adapter, model, probe_tokens, restored[0][1], 70)
    ref_logits, ref_new = reference(model, probe_tokens, 16)
    assert (rc.logits - ref_logits).abs().max().item() <= 1e-4
    assert rt.decode(rc, 16) == ref_new
    rt.finish(rc)
    # Still stored after the read (a leased load pins, so it is not promoted or dropped).
    assert None not in store.where([o.ref.key for o in plan.objects])
    rt.cache.check_integrity()
    rt.close()
    store.close()
