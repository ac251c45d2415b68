"""The index's fast paths give what the plain computations give.

* A radix node keeps its edge's bytes and start beside its tokens (``Node.edge_bytes``,
  ``Node.start``), set whenever ``tokens`` is: splits and merges keep them in step
  (``check_integrity`` recomputes them), and ``match`` / ``extend`` by bytes find what a
  token-by-token walk finds.
* ``ObjectRef`` copies ``kind`` / ``start`` / ``end`` from its key; equality and hashing
  stay the key's and the size's.
* ``CacheIndex.lookup`` searches a second time counting in-flight objects as landed
  (``pending_tokens``) only when the first search asked about one: the plan equals the
  two-search one whether saves are in flight or not.
* ``as_tokens`` returns an int64 array as is and still refuses negative ids.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from cache_support import kv_items, make_cache, state_item

from hybrid_connector.core.keys import ObjectKey, ObjectKind, as_tokens
from hybrid_connector.index.hit import find_hit
from hybrid_connector.tree.radix import IntegrityError, MatchResult, Node, ObjectRef, RadixTree


def reference_match(tree: RadixTree, toks: np.ndarray) -> tuple[int, int, int | None]:
    """(length, id of the deepest whole node, id of the partial node) token by token."""
    node, pos = tree.root, 0
    while pos < toks.size:
        child = node.children.get(int(toks[pos]))
        if child is None:
            break
        k = 0
        while k < child.tokens.size and pos + k < toks.size and child.tokens[k] == toks[pos + k]:
            k += 1
        if k < child.tokens.size:
            return pos + k, node.id, child.id
        pos, node = pos + k, child
    return pos, node.id, None


def test_edge_bytes_follow_splits_merges_and_extends() -> None:
    rng = np.random.default_rng(0)
    tree = RadixTree()
    seqs = [rng.integers(0, 4, rng.integers(1, 40)).astype(np.int64) for _ in range(120)]
    for i, s in enumerate(seqs):
        if i % 3 == 2:
            m = tree.match(s[: s.size // 2])
            tree.extend(m.node, s[m.node.depth:])
        else:
            tree.insert(s)
        tree.check_integrity()
        if i % 10 == 9:  # fold stateless single-child nodes: merges rewrite edges
            for node in list(tree.nodes()):
                if tree.node(node.id) is not None and tree.can_merge(node):
                    tree.merge_into_child(node)
            tree.check_integrity()
    for node in tree.nodes():
        assert node.edge_bytes == node.tokens.tobytes()
        assert node.start == node.depth - node.tokens.size
    for s in [*seqs, *(rng.integers(0, 4, rng.integers(0, 50)) for _ in range(200))]:
        m = tree.match(s)
        length, whole, partial = reference_match(tree, np.asarray(s, dtype=np.int64))
        assert (m.length, m.node.id, m.partial.id if m.partial else None) == (length, whole, partial)
        assert [n.depth for n in m.path] == sorted(n.depth for n in m.path)


def test_a_node_whose_tokens_are_set_again_updates_what_derives_from_them() -> None:
    node = Node(1, None, np.arange(3, 9, dtype=np.int64), 9)
    assert (node.start, node.edge_bytes) == (3, np.arange(3, 9, dtype=np.int64).tobytes())
    node.tokens = node.tokens[2:]
    assert (node.start, node.edge_bytes) == (5, np.arange(5, 9, dtype=np.int64).tobytes())


def test_object_ref_fields_are_its_keys() -> None:
    key = ObjectKey("fp", b"\x01" * 16, ObjectKind.KV, 4, 12)
    ref = ObjectRef(key, 80)
    assert (ref.kind, ref.start, ref.end) == (ObjectKind.KV, 4, 12)
    assert ref == ObjectRef(key, 80) and hash(ref) == hash(ObjectRef(key, 80))
    assert ref != ObjectRef(key, 81)
    back = pickle.loads(pickle.dumps(ref))
    assert back == ref and (back.start, back.end, back.kind) == (4, 12, ObjectKind.KV)


def test_as_tokens_returns_int64_as_is_and_refuses_negatives() -> None:
    arr = np.arange(5, dtype=np.int64)
    assert as_tokens(arr) is arr
    with pytest.raises(ValueError, match="non-negative"):
        as_tokens(np.array([1, -1], dtype=np.int64))
    assert as_tokens(arr[::2]).flags.c_contiguous  # a strided view is copied
    assert as_tokens(np.arange(4, dtype=">i8")).dtype == np.dtype(np.int64)


def two_search_plan(ix, toks: np.ndarray) -> tuple[int, int]:
    """(hit, pending_tokens) as the index computed them before the fast path: a search
    with ``usable`` and, whenever anything is in flight, one counting it as landed."""
    arr = as_tokens(toks)
    m: MatchResult = ix.tree.match(arr)

    def find(usable):
        c = ix.config
        return find_hit(m, int(arr.size), c.alignment, needs_state=ix.needs_state,
                        max_kv_len=ix.max_kv_len, usable=usable, replay=c.replay,
                        page=c.anchor_page_size, budget_frac=c.replay_budget_frac,
                        max_tokens=c.replay_max_tokens, root=ix.tree.root, needs_kv=ix.needs_kv)

    hit = find(ix.table.usable)
    pending = 0
    if ix.table.has_pending:
        later = find(lambda k: not ix.table.is_doomed(k))
        pending = later.p if later.p > hit.p else 0
    return hit.p, pending


def test_lookup_counts_in_flight_objects_as_the_two_searches_did() -> None:
    cache = make_cache(admission="last_token")
    ix = cache.index
    rng = np.random.default_rng(1)
    base = rng.integers(0, 50, 24)
    done = np.concatenate([base, rng.integers(0, 50, 16)])
    cache.save(done, [*kv_items(done, 0, 40), state_item(done, 40), state_item(done, 24)])
    flying = np.concatenate([done, rng.integers(0, 50, 24)])
    ticket = ix.begin_save(flying, [it.spec for it in
                                    [*kv_items(flying, 40, 64), state_item(flying, 64)]])
    assert ix.table.has_pending
    queries = [flying, done, base, np.concatenate([flying, [1, 2, 3]]),
               np.concatenate([done[:30], rng.integers(0, 50, 20)]), rng.integers(0, 50, 30)]
    for q in queries:
        plan = ix.lookup(q)
        assert (plan.num_tokens, plan.pending_tokens) == two_search_plan(ix, q)
    assert ix.lookup(np.concatenate([flying, [7]])).pending_tokens == 64
    ix.complete_save(ticket, list(range(len(ticket.ops))), [True] * len(ticket.ops))
    for q in queries:
        plan = ix.lookup(q)
        assert (plan.num_tokens, plan.pending_tokens) == two_search_plan(ix, q)
    assert ix.lookup(np.concatenate([flying, [7]])).num_tokens == 64
    cache.check_integrity()


def busy_by_refs(ix, node: Node) -> bool:
    """``StateTable.busy`` as it was computed before the per-node count: a ref of the node
    whose put is in flight."""
    refs = [*node.kv.values(), *node.anchors.values(), *([node.state] if node.state else [])]
    return any(ix.table.is_pending(r.key) for r in refs)


def test_busy_counts_follow_puts_splits_merges_and_evictions() -> None:
    """``busy`` reads a per-node count of pending keys, kept by the table's writers (index,
    move, land, forget): it answers what testing every ref of the node answered, while saves
    are in flight, prompts split nodes, puts land or fail, and a tight budget evicts."""
    cache = make_cache(kv=6000, state=3000, anchor=0, admission="last_token")
    ix = cache.index
    rng = np.random.default_rng(7)
    base = rng.integers(0, 50, 40)
    open_tickets = []
    for i in range(60):
        cut = int(rng.integers(8, 40))  # a new branch splits a node below the shared prefix
        toks = np.concatenate([base[:cut], rng.integers(0, 50, int(rng.integers(8, 48)))])
        end = int(toks.size)
        specs = [it.spec for it in [*kv_items(toks, 0, end), state_item(toks, end)]]
        open_tickets.append(ix.begin_save(toks, specs))
        if i % 3 == 2:  # land some puts (one in five fails), leave the rest in flight
            t = open_tickets.pop(int(rng.integers(0, len(open_tickets))))
            ix.complete_save(t, list(range(len(t.ops))),
                             [bool(rng.random() > 0.2) for _ in t.ops])
        for node in ix.tree.nodes():
            assert ix.table.busy(node) == busy_by_refs(ix, node)
        ix.table.check()
    assert ix.stats.evicted["kv"] > 0 or ix.stats.evicted["state"] > 0  # the budget bit
    for t in open_tickets:
        ix.complete_save(t, list(range(len(t.ops))), [True] * len(t.ops))
    assert not any(ix.table.busy(n) for n in ix.tree.nodes())
    cache.check_integrity()


def test_check_catches_a_pending_count_out_of_step() -> None:
    cache = make_cache(admission="last_token")
    ix = cache.index
    toks = np.arange(1, 33)
    ix.begin_save(toks, [it.spec for it in [*kv_items(toks, 0, 32), state_item(toks, 32)]])
    ix.table.check()
    ix.table._busy[next(iter(ix.table._busy))] += 1  # noqa: SLF001 (a broken count)
    with pytest.raises(IntegrityError, match="pending keys counted per node"):
        ix.table.check()
