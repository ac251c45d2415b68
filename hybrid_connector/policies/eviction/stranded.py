"""Stranded KV: bytes a recurrent model's hit rule can no longer use.

A hit at p needs KV over ``[0, p)`` and a state at exactly p. A leaf whose state was
evicted holds KV that serves no hit of its own (no state at or below it) and, unless one
of its chunks is the only KV an ancestor's checkpoint has (``serves_ancestor_state``), no
hit of anyone else: its bytes are worth nothing until they leave. Eviction policies take
such leaves first, before any object that still makes a hit possible.

Pure functions of the tree (policies may read it freely).
"""

from __future__ import annotations

from hybrid_connector.tree.radix import Node


def serves_ancestor_state(node: Node) -> bool:
    """Is a KV chunk of ``node`` (one that starts above its edge) needed by an ancestor's
    checkpoint? True when some ancestor holding a state lies inside such a chunk and the
    chunks of the path down to that ancestor do not cover ``[0, its depth)`` on their own.
    (Chunks of other branches may cover it too; counting only the path's is conservative:
    it may say True where a sibling's chunk would do, never False where a hit needs it.)"""
    starts = [r.start for r in node.kv.values() if r.start < node.start]
    if not starts:
        return False
    lo = min(starts)
    anc = node.parent
    while anc is not None and anc.depth > lo:
        if anc.state is not None and _path_reach(anc) < anc.depth:
            return True
        anc = anc.parent
    return False


def _path_reach(node: Node) -> int:
    """How far the KV chunks on the path from the root to ``node`` (inclusive) cover
    ``[0, ...)`` contiguously."""
    by_start: dict[int, int] = {}
    cur: Node | None = node
    while cur is not None:
        for ref in cur.kv.values():
            if ref.end > by_start.get(ref.start, -1):
                by_start[ref.start] = ref.end
        cur = cur.parent
    reach = 0
    while reach in by_start and by_start[reach] > reach:
        reach = by_start[reach]
    return reach


def is_stranded(node: Node) -> bool:
    """A leaf with KV, no state, no anchors, whose chunks no ancestor's checkpoint needs:
    its KV can serve no hit (see the module docstring)."""
    return (node.parent is not None and not node.children and node.state is None
            and not node.anchors and bool(node.kv) and not serves_ancestor_state(node))
