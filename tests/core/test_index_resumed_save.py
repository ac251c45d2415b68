"""A save that resumes its radix walk at the request's previous save (``begin_save(...,
start=ticket.leaf)``, what the vLLM scheduler side does for every request) decides what a
save walking from the root decides: the same keys, ops and tree, through evictions, merges
and other requests' splits of the path in between; so does a resumed ``finish``."""

from __future__ import annotations

import numpy as np
import pytest
from cache_support import CHUNK, TINY, make_cache, nbytes

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.plan import ObjectSpec


def tree_shape(ix: CacheIndex) -> list[tuple[int, int, int, tuple[int, ...], bool]]:
    return sorted((n.id, n.depth, n.parent.id if n.parent else -1, tuple(sorted(n.kv)),
                   n.state is not None) for n in ix.tree.nodes())


def specs_for(start: int, end: int, states: list[int]) -> list[ObjectSpec]:
    bounds = sorted({start, end, *range(start - start % CHUNK + CHUNK, end, CHUNK)})
    out = [ObjectSpec(ObjectKind.KV, s, e, nbytes(TINY, ObjectKind.KV, s, e))
           for s, e in zip(bounds, bounds[1:], strict=False) if e > s]
    out += [ObjectSpec(ObjectKind.STATE, q, q, nbytes(TINY, ObjectKind.STATE, q, q))
            for q in states]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_resumed_walk_gives_the_root_walks_saves(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # small pools: saves evict, and evictions prune and merge nodes on the paths
    caches = [make_cache(kv=1200, state=200, eviction="lru") for _ in range(2)]
    trunks = [rng.integers(0, 6, int(rng.integers(8, 40))) for _ in range(3)]
    live: dict[int, tuple[np.ndarray, int, tuple[int, int] | None]] = {}  # toks, saved, leaf
    next_id = evicted = resumed = 0
    for _ in range(120):
        if not live or (len(live) < 5 and rng.random() < 0.35):
            trunk = trunks[int(rng.integers(len(trunks)))]
            cut = int(rng.integers(0, trunk.size + 1))
            toks = np.concatenate([trunk[:cut], rng.integers(0, 6, int(rng.integers(4, 60)))])
            live[next_id] = (toks.astype(np.int64), 0, None)
            next_id += 1
            continue
        rid = list(live)[int(rng.integers(len(live)))]
        toks, saved, leaf = live[rid]
        if saved >= toks.size:
            del live[rid]
            for c, start in zip(caches, (leaf, None), strict=True):
                c.index.finish(toks, start=start)
            assert tree_shape(caches[0].index) == tree_shape(caches[1].index)
            assert caches[0].index.drain() == caches[1].index.drain()
            continue
        end = min(int(toks.size), saved + int(rng.integers(1, 24)))
        states = [end] if rng.random() < 0.6 else []
        specs = specs_for(saved, end, states)
        got = []
        for c, start in zip(caches, (leaf, None), strict=True):
            ix = c.index
            t = ix.begin_save(toks, specs, start=start)
            ix.complete_save(t, list(range(len(t.ops))), [True] * len(t.ops))
            got.append((t.keys, t.ops, t.leaf, tree_shape(ix), ix.drain()))
        assert got[0] == got[1]
        evicted += t.evicted_bytes
        resumed += leaf is not None and leaf[0] != 0
        live[rid] = (toks, end, got[0][2])
    assert evicted and resumed > 20  # the walks resumed, through evictions
    for c in caches:
        c.check_integrity()


def test_a_save_that_adds_nothing_past_a_split_resumes_on_its_own_path() -> None:
    """Request b's first save ends where its tokens leave request a's path and adds
    nothing (its chunks are a's): the node it split off a's edge folds back into a's
    node, and the ticket's ``leaf`` was that node, on a's path. b's next save then resumed
    its walk there and hung b's KV and state on a's path: a lookup of either served the
    other's bytes (vLLM's head-to-head runner read wrong KV at chat with one-block
    chunks). The leaf must be a node on b's own path."""
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 6, 2 * CHUNK)
    a = np.r_[shared, rng.integers(10, 16, 2 * CHUNK)].astype(np.int64)
    b = np.r_[shared, rng.integers(20, 26, 2 * CHUNK)].astype(np.int64)
    caches = [make_cache(), make_cache()]
    shapes = []
    for c, resume in zip(caches, (True, False), strict=True):
        ix = c.index
        ta = ix.begin_save(a, specs_for(0, a.size, [a.size]))
        ix.complete_save(ta, list(range(len(ta.ops))), [True] * len(ta.ops))
        tb = ix.begin_save(b, specs_for(0, shared.size, []))
        assert not any(tb.keys)  # every chunk is a's already
        node = ix.tree.node(tb.leaf[0])
        assert node is not None
        assert np.array_equal(ix.tree.tokens_to(node), b[: node.depth])
        tb2 = ix.begin_save(b, specs_for(shared.size, b.size, [b.size]),
                            start=tb.leaf if resume else None)
        ix.complete_save(tb2, list(range(len(tb2.ops))), [True] * len(tb2.ops))
        leaf = ix.tree.node(tb2.leaf[0])
        assert leaf is not None and np.array_equal(ix.tree.tokens_to(leaf), b[: leaf.depth])
        for toks, other in ((a, tb2), (b, ta)):  # neither serves the other's objects
            plan = ix.lookup(np.r_[toks, 0], alignment=1)
            assert plan.num_tokens == toks.size and plan.state is not None
            past = {k for k in other.keys if k is not None and k.end > shared.size}
            assert not {o.ref.key for o in plan.objects} & past
        shapes.append(tree_shape(ix))
        c.check_integrity()
    assert shapes[0] == shapes[1]
