"""Stranded KV: bytes a recurrent model's hit rule can no longer use.

A hit at p needs KV over ``[0, p)`` and a state at exactly p. A leaf whose state was
evicted holds KV that serves no hit of its own (no state at or below it) and, unless one
of its chunks is the only KV an ancestor's checkpoint has
(``tree.coverage.serves_ancestor_state``, counting the path's own cover), no
hit of anyone else: its bytes are worth nothing until they leave. Eviction policies take
such leaves first, before any object that still makes a hit possible.

Pure functions of the tree (policies may read it freely).
"""

from __future__ import annotations

from hybrid_connector.tree.coverage import serves_ancestor_state
from hybrid_connector.tree.radix import Node


def is_stranded(node: Node) -> bool:
    """A leaf with KV, no state, no anchors, whose chunks no ancestor's checkpoint needs:
    its KV can serve no hit (see the module docstring)."""
    return (node.parent is not None and not node.children and node.state is None
            and not node.anchors and bool(node.kv)
            and not serves_ancestor_state(node, path_covers=True))
