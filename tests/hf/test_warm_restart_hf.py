"""Warm restart with real model compute: a runtime over an NVMe directory serves requests and
stops; a new runtime over the same directory re-links what is on disk, hits on the first
request sharing a prefix, and its restored states and logits equal a full prefill's."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_support import (
    assert_exact_hit,
    random_tokens,
    runtime,
    tiny_model,
)

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.nvme import NvmeTier


def nvme_store(path: Path) -> TieredStore:
    big = {ObjectKind.KV: 1 << 26, ObjectKind.STATE: 1 << 26, ObjectKind.ANCHOR: 1 << 24}
    return TieredStore([NvmeTier(path, big, fsync=False)])


@pytest.mark.parametrize("arch", ["qwen3_5", "nemotron_h"])
def test_first_request_after_a_restart_hits_exactly(arch: str, tmp_path: Path) -> None:
    model = tiny_model(arch)
    vocab = model.config.vocab_size
    prefix = random_tokens(64, vocab, 21)
    rt = runtime(model, store=nvme_store(tmp_path / "nvme"))
    for seed in (22, 23):  # the second request checkpoints the branch at 64
        r = rt.prefill(prefix + random_tokens(20, vocab, seed))
        rt.decode(r, 3)
        rt.finish(r)
    rt.close()
    rt.cache.close()

    again = runtime(model, store=nvme_store(tmp_path / "nvme"))
    assert again.cache.rebuilt.indexed["state"] >= 2 and not again.cache.rebuilt.unlinked
    probe = prefix + random_tokens(15, vocab, 24)
    assert_exact_hit(again, model, probe, 64)
