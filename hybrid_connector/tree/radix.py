"""Token radix tree: the index of every cached object.

Each node owns the edge ``tokens`` that leads to it from its parent and ends at token
position ``depth``. Objects hang off nodes as ``ObjectRef`` records:

* ``kv``: KV chunks whose *end* lies inside the edge (``parent.depth < end <= depth``),
  keyed by end position. A chunk may start in an ancestor's edge.
* ``state``: at most one recurrent-state checkpoint, at exactly ``depth``. A node with KV
  but no state is a tombstone.
* ``anchors``: anchor blocks whose page end lies inside the edge, keyed by end.

Locks: a KV lock taken on a node counts on the node and every ancestor (``kv_lock``),
because loading a prefix needs all of it; state and anchor locks are node local. The
tree only records; the ``HybridCache`` decides what to store and evict.

Invariants (``check_integrity`` recomputes them): depths add up, children are keyed by
their first token, refs lie inside their node's edge, byte counters equal the sum of the
refs, ``kv_lock == kv_lock_own + sum(child.kv_lock)``, and lock counts are never negative.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from hybrid_connector.core.keys import ObjectKind, as_tokens
from hybrid_connector.tree.nodes import IntegrityError, MatchResult, Node, ObjectRef

__all__ = ["IntegrityError", "MatchResult", "Node", "ObjectRef", "RadixTree"]


class RadixTree:
    """Token radix tree with object slots, locks and stable node ids.

    ``match`` has no side effects. ``insert``/``split`` keep every existing ``Node``
    object valid (a split creates the *parent* half as a new node, so the node that held
    a state keeps its id). ``remove_leaf`` and ``merge_into_child`` retire node ids.
    """

    def __init__(self, on_move: Callable[[Node, Iterable[ObjectRef]], None] | None = None) -> None:
        """``on_move(node, refs)`` is told whenever a split or merge moves refs to ``node``
        (so an owner indexing refs by node id can follow)."""
        self.on_move = on_move
        self._next_id = 1
        self.root = Node(0, None, np.zeros(0, dtype=np.int64), 0)
        self._nodes: dict[int, Node] = {0: self.root}
        self.bytes = {k: 0 for k in ObjectKind}
        self.num_states = 0

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._nodes) - 1

    @property
    def next_id(self) -> int:
        """Every node id ever issued is below this (ids are never reused), so a policy can
        find the nodes inserts and splits created since it last looked."""
        return self._next_id

    def node(self, node_id: int) -> Node | None:
        """The live node with this id, or ``None`` once it was removed or merged."""
        return self._nodes.get(node_id)

    def nodes(self) -> Iterator[Node]:
        """All non-root nodes (order unspecified). Do not mutate the tree while iterating."""
        return (n for n in self._nodes.values() if n is not self.root)

    def match(self, tokens: Sequence[int] | np.ndarray, start: Node | None = None) -> MatchResult:
        """Longest prefix of ``tokens`` present in the tree. No side effects.

        ``start``: a live node the caller knows ``tokens[:start.depth]`` leads to (a node's
        path never changes while it lives): the walk begins there, so a request extending
        its own last save does not walk its whole prefix again, and ``path`` lists only the
        nodes below ``start``."""
        return self.match_tokens(as_tokens(tokens), start)

    def match_tokens(self, arr: np.ndarray, start: Node | None = None) -> MatchResult:
        """``match`` of tokens already checked by ``as_tokens`` (the index checks a query
        once, then walks with it)."""
        node = self.root if start is None else start
        pos = node.depth
        size = int(arr.size)
        if pos > size:
            raise ValueError(f"start node at depth {pos} lies past the {size} tokens")
        path: list[Node] = []
        if pos == size:
            return MatchResult(pos, node, (), None, None)
        # one copy of the tokens past ``start``; each edge is then one bytes comparison
        base = pos
        raw = arr[base:].tobytes()
        while pos < size:
            child = node.children.get(int(arr[pos]))
            if child is None:
                break
            edge = child.edge_bytes
            off = 8 * (pos - base)
            if edge != raw[off : off + len(edge)]:
                # Stopped inside the edge (or the query ends inside it): inserting the query
                # would split here.
                n = min(len(edge) // 8, size - pos)
                same = child.tokens[:n] == arr[pos : pos + n]
                k = n if bool(same.all()) else int(np.argmin(same))
                return MatchResult(pos + k, node, tuple(path), child, pos + k if k else None)
            pos += len(edge) // 8
            node = child
            path.append(child)
        return MatchResult(pos, node, tuple(path), None, None)

    def speculative_insert(self, tokens: Sequence[int] | np.ndarray) -> int | None:
        """Where inserting ``tokens`` would create a new intermediate (branch) node, without
        inserting: Marconi's speculative insertion. ``None`` when no split would happen."""
        return self.match(tokens).branch_point

    def path_to(self, node: Node) -> list[Node]:
        """Nodes from the root's child down to ``node`` (empty for the root)."""
        out = []
        cur: Node | None = node
        while cur is not None and cur is not self.root:
            out.append(cur)
            cur = cur.parent
        out.reverse()
        return out

    def tokens_to(self, node: Node) -> np.ndarray:
        """The token prefix ``[0, node.depth)`` that leads to ``node``."""
        parts = [n.tokens for n in self.path_to(node)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    # --------------------------------------------------------------- mutation
    def _new_node(self, parent: Node, tokens: np.ndarray, depth: int) -> Node:
        node = Node(self._next_id, parent, tokens, depth)
        self._next_id += 1
        self._nodes[node.id] = node
        return node

    def split(self, node: Node, at: int) -> Node:
        """Cut ``node``'s edge at absolute position ``at``; return the new upper node.

        The upper node gets the edge ``[node.start, at)`` and the KV chunks and anchors
        ending there; ``node`` keeps its id, its state, its lower edge and the rest.
        Raises ValueError unless ``node.start < at < node.depth``.
        """
        if not node.start < at < node.depth or node.parent is None:
            raise ValueError(f"cannot split {node} at {at}")
        cut = at - node.start
        upper = self._new_node(node.parent, node.tokens[:cut], at)
        node.parent.children[int(node.tokens[0])] = upper
        upper.children[int(node.tokens[cut])] = node
        node.parent = upper
        node.tokens = node.tokens[cut:]
        upper.kv = {e: r for e, r in node.kv.items() if e <= at}
        node.kv = {e: r for e, r in node.kv.items() if e > at}
        upper.anchors = {e: r for e, r in node.anchors.items() if e <= at}
        node.anchors = {e: r for e, r in node.anchors.items() if e > at}
        upper.kv_lock = node.kv_lock  # every lock below passes through the new node
        upper.last_access = node.last_access
        if self.on_move is not None and (upper.kv or upper.anchors):
            self.on_move(upper, [*upper.kv.values(), *upper.anchors.values()])
        return upper

    def insert(self, tokens: Sequence[int] | np.ndarray, start: Node | None = None) -> Node:
        """Make ``tokens`` a path ending exactly at a node; return that node (``start``: as
        for ``match``).

        Splits at most one edge and adds at most one leaf. Existing nodes stay valid.
        Inserting the empty sequence returns the root.
        """
        return self.insert_tokens(as_tokens(tokens), start)

    def insert_tokens(self, arr: np.ndarray, start: Node | None = None) -> Node:
        """``insert`` of tokens already checked by ``as_tokens``."""
        m = self.match_tokens(arr, start)
        node = m.node
        if m.partial is not None and m.length > m.partial.start:
            node = self.split(m.partial, m.length)
        if m.length < arr.size:
            leaf = self._new_node(node, arr[m.length :].copy(), int(arr.size))
            node.children[int(arr[m.length])] = leaf
            node = leaf
        return node

    def extend(self, node: Node, tail: Sequence[int] | np.ndarray) -> Node:
        """``insert`` of ``path(node) + tail`` given only the tail (``node`` live): the
        caller never materialises the prefix. Returns the node ending there."""
        arr = as_tokens(tail)
        base, cur, i = node.depth, node, 0
        size = int(arr.size)
        raw = arr.tobytes() if size else b""
        while i < size:
            child = cur.children.get(int(arr[i]))
            if child is None:
                break
            edge = child.edge_bytes
            if edge != raw[8 * i : 8 * i + len(edge)]:
                n = min(len(edge) // 8, size - i)
                same = child.tokens[:n] == arr[i : i + n]
                k = n if bool(same.all()) else int(np.argmin(same))
                cur, i = self.split(child, base + i + k), i + k
                break
            cur, i = child, i + len(edge) // 8
        if i < arr.size:
            leaf = self._new_node(cur, arr[i:].copy(), base + int(arr.size))
            cur.children[int(arr[i])] = leaf
            cur = leaf
        return cur

    def node_at(self, tokens: Sequence[int] | np.ndarray, end: int) -> Node:
        """The node whose edge contains position ``end`` of ``tokens`` (must be in the tree).

        Raises KeyError when ``tokens[:end]`` is not fully in the tree; ``end == 0``
        gives the root.
        """
        arr = as_tokens(tokens)[:end]
        m = self.match(arr)
        if m.length < end:
            raise KeyError(f"prefix of length {end} is not in the tree")
        return m.partial if m.partial is not None else m.node

    def add_kv(self, node: Node, ref: ObjectRef) -> ObjectRef | None:
        """Attach a KV chunk ending in ``node``'s edge; return the ref it replaced."""
        self._check_inside(node, ref)
        old = node.kv.get(ref.end)
        node.kv[ref.end] = ref
        self.bytes[ObjectKind.KV] += ref.nbytes - (old.nbytes if old else 0)
        return old

    def add_anchor(self, node: Node, ref: ObjectRef) -> ObjectRef | None:
        """Attach an anchor block ending in ``node``'s edge; return the ref it replaced."""
        self._check_inside(node, ref)
        old = node.anchors.get(ref.end)
        node.anchors[ref.end] = ref
        self.bytes[ObjectKind.ANCHOR] += ref.nbytes - (old.nbytes if old else 0)
        return old

    def set_state(self, node: Node, ref: ObjectRef) -> ObjectRef | None:
        """Attach the checkpoint at exactly ``node.depth``; return the ref it replaced."""
        if ref.end != node.depth or ref.kind is not ObjectKind.STATE:
            raise ValueError(f"state {ref.key} does not belong at depth {node.depth}")
        old = node.state
        node.state = ref
        self.bytes[ObjectKind.STATE] += ref.nbytes - (old.nbytes if old else 0)
        self.num_states += old is None
        return old

    def drop_state(self, node: Node) -> ObjectRef | None:
        """Detach the node's checkpoint (making it a tombstone). Raises if state-locked."""
        if node.state_lock:
            raise ValueError(f"state of {node} is locked")
        old, node.state = node.state, None
        if old is not None:
            self.bytes[ObjectKind.STATE] -= old.nbytes
            self.num_states -= 1
        return old

    def drop_ref(self, node: Node, ref: ObjectRef) -> bool:
        """Detach one specific ref (KV, anchor or state) if it is still attached."""
        if ref.kind is ObjectKind.STATE:
            if node.state == ref:
                self.drop_state(node)
                return True
            return False
        slot = node.kv if ref.kind is ObjectKind.KV else node.anchors
        if slot.get(ref.end) != ref:
            return False
        del slot[ref.end]
        self.bytes[ref.kind] -= ref.nbytes
        return True

    def can_remove(self, node: Node) -> bool:
        """Whether ``remove_leaf(node)`` is allowed: a non-root leaf without any lock."""
        return (node is not self.root and not node.children
                and not (node.kv_lock or node.state_lock or node.anchor_lock))

    def can_merge(self, node: Node) -> bool:
        """Whether ``merge_into_child(node)`` is allowed: a non-root, stateless node with one
        child and no lock of its own."""
        return (node is not self.root and len(node.children) == 1 and node.state is None
                and not (node.kv_lock_own or node.state_lock or node.anchor_lock))

    def remove_leaf(self, node: Node) -> list[ObjectRef]:
        """Remove an unlocked leaf and return every ref it held (for the store to free)."""
        if not self.can_remove(node):
            raise ValueError(f"cannot remove {node}: not an unlocked leaf")
        refs = [*node.kv.values(), *node.anchors.values()]
        if node.state is not None:
            refs.append(node.state)
            self.drop_state(node)
        for r in node.kv.values():
            self.bytes[ObjectKind.KV] -= r.nbytes
        for r in node.anchors.values():
            self.bytes[ObjectKind.ANCHOR] -= r.nbytes
        node.kv, node.anchors = {}, {}
        assert node.parent is not None
        del node.parent.children[int(node.tokens[0])]
        del self._nodes[node.id]
        node.parent = None
        return refs

    def merge_into_child(self, node: Node) -> Node:
        """Fold a single-child, stateless, unlocked node into its child; return the child.

        The child keeps its id and gains the edge prefix and the refs; ``node``'s id is
        retired. Raises ValueError if ``node`` does not qualify.
        """
        if not self.can_merge(node):
            raise ValueError(f"cannot merge {node}")
        (child,) = node.children.values()
        assert node.parent is not None
        child.tokens = np.concatenate([node.tokens, child.tokens])
        child.kv.update(node.kv)
        child.anchors.update(node.anchors)
        child.parent = node.parent
        node.parent.children[int(node.tokens[0])] = child
        child.last_access = max(child.last_access, node.last_access)
        if self.on_move is not None and (node.kv or node.anchors):
            self.on_move(child, [*node.kv.values(), *node.anchors.values()])
        del self._nodes[node.id]
        node.parent, node.children, node.kv, node.anchors = None, {}, {}, {}
        return child

    # ------------------------------------------------------------------ locks
    def lock_kv(self, node: Node, delta: int = 1) -> None:
        """Add ``delta`` KV locks on ``node`` (counted on every ancestor too)."""
        if node.kv_lock_own + delta < 0:
            raise ValueError(f"KV lock underflow on {node}")
        node.kv_lock_own += delta
        cur: Node | None = node
        while cur is not None:
            cur.kv_lock += delta
            cur = cur.parent

    def lock_state(self, node: Node, delta: int = 1) -> None:
        """Add ``delta`` node-local state locks."""
        if node.state_lock + delta < 0:
            raise ValueError(f"state lock underflow on {node}")
        node.state_lock += delta

    def lock_anchors(self, node: Node, delta: int = 1) -> None:
        """Add ``delta`` node-local anchor locks."""
        if node.anchor_lock + delta < 0:
            raise ValueError(f"anchor lock underflow on {node}")
        node.anchor_lock += delta

    # -------------------------------------------------------------- integrity
    @staticmethod
    def _check_inside(node: Node, ref: ObjectRef) -> None:
        if not node.start < ref.end <= node.depth:
            raise ValueError(f"{ref.key} ends outside {node}")

    def check_integrity(self) -> None:
        """Recompute every counter and structural invariant; raise IntegrityError if off."""

        def fail(msg: str) -> None:
            raise IntegrityError(msg)

        totals = {k: 0 for k in ObjectKind}
        states = 0
        seen = 0
        stack = [self.root]
        while stack:
            n = stack.pop()
            seen += 1
            if self._nodes.get(n.id) is not n:
                fail(f"{n} not registered under its id")
            if n is not self.root:
                parent = n.parent
                if n.tokens.size == 0:
                    fail(f"{n} has an empty edge")
                if parent is None or parent.children.get(int(n.tokens[0])) is not n:
                    raise IntegrityError(f"{n} not reachable from its parent by its first token")
                if n.depth != parent.depth + n.tokens.size:
                    fail(f"{n} depth mismatch")
            if n.edge_bytes != n.tokens.tobytes() or n.start != n.depth - n.tokens.size:
                fail(f"{n} edge bytes or start out of step with its tokens")
            for slot, kind in ((n.kv, ObjectKind.KV), (n.anchors, ObjectKind.ANCHOR)):
                for end, ref in slot.items():
                    if ref.end != end or ref.kind is not kind or not n.start < end <= n.depth:
                        fail(f"{n} holds misplaced {ref.key}")
                    totals[kind] += ref.nbytes
            if n.state is not None:
                if n.state.end != n.depth or n.state.kind is not ObjectKind.STATE:
                    fail(f"{n} holds misplaced state {n.state.key}")
                totals[ObjectKind.STATE] += n.state.nbytes
                states += 1
            if min(n.kv_lock_own, n.state_lock, n.anchor_lock) < 0:
                fail(f"{n} has a negative lock count")
            expect = n.kv_lock_own + sum(c.kv_lock for c in n.children.values())
            if n.kv_lock != expect:
                fail(f"{n} kv_lock {n.kv_lock} != {expect}")
            for first, c in n.children.items():
                if c.parent is not n or int(c.tokens[0]) != first:
                    fail(f"{c} mis-linked under {n}")
            stack.extend(n.children.values())
        if seen != len(self._nodes):
            fail(f"{len(self._nodes) - seen} registered nodes are unreachable")
        if totals != self.bytes:
            fail(f"byte counters {self.bytes} != recomputed {totals}")
        if states != self.num_states:
            fail(f"state count {self.num_states} != recomputed {states}")
