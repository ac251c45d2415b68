"""A model without attention layers (a pure state-space LM: Mamba, Mamba2, FalconMamba)
stores no KV: every hit is a checkpoint, found along the whole radix match (the mirror of
the attention-only path, where the KV reach alone is the hit)."""

from __future__ import annotations

import numpy as np
from cache_support import TINY, make_cache, state_item

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.plan import SaveItem

TINY_STATE = ModelGeometry.from_dict({
    **{k: v for k, v in TINY.to_dict().items() if k not in ("attention", "mlp")},
    "name": "tiny-state-only", "layers": ["gdn+none", "gdn+none"],
})  # fmt: skip


def seq(i: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) + 1000 * i


def _save_states(cache, toks, states) -> None:  # type: ignore[no-untyped-def]
    toks = np.asarray(toks)
    items: list[SaveItem] = [state_item(toks, p, TINY_STATE) for p in states]
    cache.save(toks, items)


def test_state_only_hit_is_the_deepest_checkpoint() -> None:
    assert not TINY_STATE.attention_layers and TINY_STATE.kv_bytes_per_token() == 0
    c = make_cache(geo=TINY_STATE)
    a = seq(0, 40)
    _save_states(c, a, [12, 24])
    plan = c.lookup(a)
    assert plan.num_tokens == 24 and plan.exact and plan.state is not None and not plan.kv
    assert plan.state.ref.key.start == 24
    # A prompt that shares only 20 tokens hits the checkpoint at 12.
    b = np.concatenate([a[:20], seq(7, 10)])
    assert c.lookup(b).num_tokens == 12
    lease = c.acquire(plan)
    res = c.load(plan)
    c.release(lease)
    assert res.num_tokens == 24 and res.state is not None and not res.kv
    c.check_integrity()


def test_state_only_without_a_checkpoint_is_a_miss() -> None:
    c = make_cache(geo=TINY_STATE)
    a = seq(0, 40)
    _save_states(c, a, [])
    assert c.lookup(a).num_tokens == 0
    _save_states(c, a, [16])
    plan = c.lookup(a)
    assert plan.num_tokens == 16
    c.store.remove([plan.state.ref.key])  # the checkpoint is lost: the load misses
    lease = c.acquire(plan)
    res = c.load(plan)
    c.release(lease)
    assert res.num_tokens == 0 and res.state is None
