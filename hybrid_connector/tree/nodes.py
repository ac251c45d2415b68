"""The radix tree's record types: ``Node``, ``ObjectRef``, ``MatchResult``, ``IntegrityError``.

Split from ``radix`` (which re-exports them) so modules that only read nodes and refs do
not depend on the tree's mutation logic. See ``hybrid_connector.tree.radix`` for what the
fields mean and the invariants the tree keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from hybrid_connector.core.keys import ObjectKey, ObjectKind


class IntegrityError(AssertionError):
    """The tree's bookkeeping is inconsistent (a bug, never bad user input)."""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """A stored object as the index sees it: its key and its size in bytes. ``kind``,
    ``start`` and ``end`` are the key's, copied once (the hit search reads them per ref)."""

    key: ObjectKey
    nbytes: int
    kind: ObjectKind = field(init=False, repr=False, compare=False)
    start: int = field(init=False, repr=False, compare=False)
    end: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key = self.key
        object.__setattr__(self, "kind", key.kind)
        object.__setattr__(self, "start", key.start)
        object.__setattr__(self, "end", key.end)


class Node:
    """One radix node. Mutate only through ``RadixTree`` methods.

    ``tokens`` (the edge, int64) comes with two values derived from it when it is set:
    ``edge_bytes`` (its bytes, so a match compares an edge with one ``bytes`` comparison
    instead of numpy calls) and ``start``; ``depth`` never changes once the node exists."""

    __slots__ = (
        "id", "parent", "children", "_tokens", "edge_bytes", "start", "depth", "kv", "state",
        "anchors", "kv_lock", "kv_lock_own", "state_lock", "anchor_lock", "last_access", "hits",
    )

    def __init__(self, node_id: int, parent: Node | None, tokens: np.ndarray, depth: int) -> None:
        self.id = node_id
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.depth = depth
        self.tokens = tokens
        self.kv: dict[int, ObjectRef] = {}
        self.state: ObjectRef | None = None
        self.anchors: dict[int, ObjectRef] = {}
        self.kv_lock = 0
        self.kv_lock_own = 0
        self.state_lock = 0
        self.anchor_lock = 0
        self.last_access = 0.0
        self.hits = 0

    @property
    def tokens(self) -> np.ndarray:
        """The edge: the tokens from ``start`` (where the edge begins) to ``depth``."""
        return self._tokens

    @tokens.setter
    def tokens(self, tokens: np.ndarray) -> None:
        self._tokens = tokens
        self.edge_bytes = tokens.tobytes()
        self.start = self.depth - int(tokens.size)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def is_tombstone(self) -> bool:
        return self.state is None

    def nbytes(self, kind: ObjectKind | None = None) -> int:
        """Bytes of the objects on this node (of one kind, or all)."""
        total = 0  # plain loops: eviction policies ask this of every node they refresh
        if kind is None or kind is ObjectKind.KV:
            for r in self.kv.values():
                total += r.nbytes
        if (kind is None or kind is ObjectKind.STATE) and self.state is not None:
            total += self.state.nbytes
        if kind is None or kind is ObjectKind.ANCHOR:
            for r in self.anchors.values():
                total += r.nbytes
        return total

    def __repr__(self) -> str:
        return (
            f"Node(id={self.id}, [{self.start},{self.depth}), kv={len(self.kv)}, "
            f"state={self.state is not None}, anchors={len(self.anchors)}, "
            f"children={len(self.children)}, kv_lock={self.kv_lock})"
        )


class MatchResult(NamedTuple):
    """Result of ``RadixTree.match``; computing it never mutates the tree.

    ``length``: tokens matched. ``node``: deepest node whose whole edge matched (root if
    none). ``path``: nodes root-exclusive down to ``node``. ``partial``: the node whose edge
    the match stopped inside (``None`` when it stopped at a node boundary), and
    ``branch_point``: the position where inserting the query would create a new
    intermediate node (Marconi's speculative insertion), else ``None``.
    """

    length: int
    node: Node
    path: tuple[Node, ...]
    partial: Node | None
    branch_point: int | None
