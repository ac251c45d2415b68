"""Which KV chunks a checkpoint higher up the tree still needs: pure walks over the nodes,
shared by the index's reclaim (which releases stateless leaves) and the eviction policies
(which rank stranded KV first)."""

from __future__ import annotations

from hybrid_connector.tree.radix import Node


def serves_ancestor_state(node: Node, *, path_covers: bool = False) -> bool:
    """Does a KV chunk of ``node`` that starts above its edge reach across an ancestor's
    checkpoint? (A chunk saved past a checkpoint, e.g. a request's tail chunk past its
    aligned final checkpoint, can be the only KV for the tokens just before that
    checkpoint: releasing it would strand the state.)

    ``path_covers=False`` (conservative): True for any ancestor with a state inside such a
    chunk. ``path_covers=True``: only where the chunks on the path from the root down to
    that ancestor do not already cover ``[0, its depth)`` on their own. (Chunks of other
    branches may cover it too; counting only the path's may say True where a sibling's
    chunk would do, never False where a hit needs it.)"""
    starts = [r.start for r in node.kv.values() if r.start < node.start]
    if not starts:
        return False
    lo = min(starts)
    anc = node.parent
    while anc is not None and anc.depth > lo:
        if anc.state is not None and (not path_covers or path_reach(anc) < anc.depth):
            return True
        anc = anc.parent
    return False


def path_reach(node: Node) -> int:
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
