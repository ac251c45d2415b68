"""SGLang's vocabulary without SGLang: page hashes as object keys (no rehashing, injective,
bounded) and the per-pool hit rule of ``batch_exists_v2``."""

from __future__ import annotations

import pytest

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.integrations.sglang.keys import (
    PageKeys,
    hash_bytes,
    pool_restorable,
    restorable_prefixes,
)

SHARD = {"tp_rank": 0, "tp_size": 2}


def test_hex_hashes_are_their_bytes_and_text_cannot_alias_them() -> None:
    sha = "ab" * 32
    assert hash_bytes(sha) == b"h" + bytes.fromhex(sha)
    assert hash_bytes("xy") == b"txy" != hash_bytes("7879")
    with pytest.raises(ValueError, match="non-empty string"):
        hash_bytes("")
    with pytest.raises(ValueError, match="longer than"):
        hash_bytes("0" * 130)
    with pytest.raises(ValueError, match="non-empty string"):
        hash_bytes(None)  # type: ignore[arg-type]


def test_keys_per_pool_kind_and_shard() -> None:
    keys = PageKeys("m", 64, "page_first", SHARD)
    kv, st = keys.key("kv", "aa"), keys.key("mamba", "aa")
    assert (kv.kind, kv.start, kv.end) == (ObjectKind.KV, 0, 64)
    assert (st.kind, st.start, st.end) == (ObjectKind.STATE, 0, 0)
    assert kv.fingerprint != st.fingerprint
    other_rank = PageKeys("m", 64, "page_first", {**SHARD, "tp_rank": 1})
    assert other_rank.key("kv", "aa") != kv
    other_layout = PageKeys("m", 64, "layer_first", SHARD)
    assert other_layout.key("kv", "aa") != kv
    mla = [PageKeys("m", 64, "page_first", {**SHARD, "tp_rank": r}, kv_replicated=True)
           for r in (0, 1)]
    assert mla[0].key("kv", "aa") == mla[1].key("kv", "aa")  # MLA KV is the same on every rank
    assert mla[0].key("mamba", "aa") != mla[1].key("mamba", "aa")  # states are TP-sharded
    with pytest.raises(ValueError, match="not stored"):
        keys.key("swa", "aa")
    with pytest.raises(ValueError, match="page_size"):
        PageKeys("m", 0, "page_first", SHARD)


def test_hit_rule() -> None:
    present = [True, False, True, True]
    assert pool_restorable(present, "all_pages", 1) == {1}
    assert pool_restorable(present, "trailing_pages", 1) == {1, 3, 4}
    # a prefix shorter than the window needs only the pages it has (as HiCacheFile)
    assert pool_restorable(present, "trailing_pages", 2) == {1, 4}
    with pytest.raises(ValueError, match="unsupported"):
        pool_restorable(present, "block_groups", 1)
    kv = [True] * 4 + [False, True]
    assert restorable_prefixes(kv, [("mamba", "trailing_pages", 1, present)]) \
        == (4, {"kv": 4, "mamba": 4}, [1, 3, 4])
    assert restorable_prefixes(kv, [("x", "block_groups", 1, present)]) == (0, {"kv": 4}, [])
    assert restorable_prefixes([False], []) == (0, {}, [])
