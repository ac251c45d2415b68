"""Incremental and engine-provided prefix hashes: same keys as hashing from scratch."""

from __future__ import annotations

import numpy as np
import pytest
from cache_support import kv_items, make_cache, state_item
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_connector.core.hashes import ChainHasher, EngineHashes
from hybrid_connector.core.keys import ROOT_HASH, PrefixHasher


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), max_size=40), max_size=6), st.integers(1, 9))
def test_chain_hasher_equals_hashing_from_scratch(parts, block) -> None:
    ch = ChainHasher(block)
    seq: list[int] = []
    for part in parts:
        ch.append(part)
        seq += part
        ref = PrefixHasher(seq, block)
        assert len(ch) == len(seq)
        assert [ch.at(e) for e in range(len(seq) + 1)] == [ref.at(e) for e in range(len(seq) + 1)]
    with pytest.raises(ValueError):
        ch.at(len(seq) + 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=60), st.lists(st.lists(st.integers(0, 9), max_size=25),
       max_size=4), st.integers(1, 7))
def test_a_chain_hasher_with_ahead_hashes_like_one_without(ahead_toks, parts, block) -> None:
    """``ahead`` is used only while the tokens match it: diverging from it, growing past it
    or a block size of its own all give the hashes of hashing from scratch."""
    ahead = PrefixHasher(ahead_toks, block)
    for size in (block, block + 1):
        ch, plain = ChainHasher(size, (), ahead), ChainHasher(size)
        for part in [ahead_toks[: len(ahead_toks) // 2], *parts]:
            ch.append(part)
            plain.append(part)
            ends = range(len(plain) + 1)
            assert [ch.at(e) for e in ends] == [plain.at(e) for e in ends]


def test_a_chain_hasher_with_ahead_takes_its_blocks(monkeypatch) -> None:
    toks = np.arange(50) + 1
    ahead = PrefixHasher(toks, 4)
    calls = []
    import hybrid_connector.core.hashes as hashes_mod
    real = hashes_mod._h
    monkeypatch.setattr(hashes_mod, "_h", lambda *a: calls.append(1) or real(*a))
    ch = ChainHasher(4, toks[:20], ahead)
    ch.append(toks[20:])
    assert not calls and ch.at(48) == ahead.at(48)       # nothing hashed twice
    ch.append([1, 2, 3, 4])                              # past it: hashed again
    assert len(calls) == 1 and ch.at(52) == PrefixHasher(np.r_[toks, [1, 2, 3, 4]], 4).at(52)


def test_engine_hashes_at_block_ends_and_inside_blocks() -> None:
    blocks = [bytes([i]) * 32 for i in range(1, 4)]
    eh = EngineHashes(4, blocks)
    assert eh.at(0) == ROOT_HASH and eh.at(4) == blocks[0] and eh.at(12) == blocks[2]
    with pytest.raises(ValueError, match="no engine hash"):
        eh.at(6)                                         # inside a block, no tokens
    with pytest.raises(ValueError, match="no engine hash"):
        eh.at(16)                                        # past the hashes
    tok = EngineHashes(4, blocks, tokens=np.arange(14))
    assert tok.at(6) != tok.at(7) and tok.at(6) not in blocks
    with pytest.raises(ValueError, match="not non-empty bytes"):
        EngineHashes(4, [b""])


def test_saves_keyed_by_a_chain_hasher_hit_like_any_other() -> None:
    a = np.arange(40) + 7
    c1, c2 = make_cache(), make_cache()
    items = kv_items(a, 0, 40) + [state_item(a, 24)]
    c1.save(a, items)
    ch = ChainHasher(c2.config.hash_block_size, a[:16])
    ch.append(a[16:])                                    # as a request grows
    assert c2.save(a, items, hashes=ch).stored == len(items)
    assert set(c2.index.where) == set(c1.index.where)    # the very same keys
    assert c2.lookup(np.r_[a, [1]]).num_tokens == 24


def test_a_save_resumes_where_the_request_last_saved() -> None:
    a = np.arange(64) + 3
    hinted, plain = make_cache(), make_cache()
    leaf = None
    for s in range(0, 64, 8):
        leaf = hinted.save(a[: s + 8], kv_items(a, s, s + 8), start=leaf).leaf
        plain.save(a[: s + 8], kv_items(a, s, s + 8))
    assert leaf[1] == 64 and hinted.tree.node(leaf[0]).depth == 64
    assert set(hinted.index.where) == set(plain.index.where)
    stale = (leaf[0] + 999, 64)                          # a node that is not there
    assert hinted.save(a, [state_item(a, 64)], start=stale).stored == 1
    assert hinted.lookup(np.r_[a, [1]]).num_tokens == 64
    hinted.check_integrity()
