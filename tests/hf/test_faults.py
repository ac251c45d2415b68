"""Faults on the load path: the runtime recomputes and stays exact (logits and cache)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from hf_support import (
    assert_restored_exact,
    captured_restores,
    random_tokens,
    reference,
    runtime,
    tiny_model,
)

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.memory import MemoryTier


def test_failed_load_recomputes() -> None:
    """A read that fails after the plan was made (a store fault): the runtime recomputes
    from scratch, reports the failure and still returns full-prefill logits."""
    class FaultyTier(MemoryTier):
        """Reads of the keys in ``fail`` fail (the object stays held: unreadable now)."""

        fail: set[ObjectKey] = set()

        def get(self, keys: Sequence[ObjectKey], device: Any = None) -> list[torch.Tensor | None]:
            got = super().get(keys, device)
            return [None if k in self.fail else t for k, t in zip(keys, got, strict=True)]

    model = tiny_model("qwen3_5")
    tier = FaultyTier("memory", {k: 1 << 30 for k in ObjectKind})
    store = TieredStore([tier], inline=True)
    rt = runtime(model, store=store)
    vocab = model.config.vocab_size
    prefix = random_tokens(40, vocab, 31)
    for s in (32, 33):
        rt.finish(rt.prefill(prefix + random_tokens(10, vocab, s)))
    c = prefix + random_tokens(12, vocab, 34)
    plan = rt.cache.lookup(c, alignment=1)
    assert plan.num_tokens == 40 and plan.state is not None
    tier.fail.add(plan.state.ref.key)
    with captured_restores(rt) as restored:
        rc = rt.prefill(c)
    assert rc.info.load_failed == 1 and rc.info.hit_tokens == 0 and rc.info.exact
    assert restored == []  # nothing restored from the half-loaded checkpoint
    ref_logits, _ = reference(model, c, 0)
    assert (rc.logits - ref_logits).abs().max().item() <= 1e-4
    # The recomputed cache is a full prefill's (KV over the prompt, state at its end).
    assert_restored_exact(rt.adapter, model, c, rc.model_cache, len(c))
