"""LRU eviction: least recently used evictable node first (SGLang-style path refresh)."""

from __future__ import annotations

from collections.abc import Sequence

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies.base import EvictionPolicy
from hybrid_connector.tree.radix import Node


class LRUEviction(EvictionPolicy):
    """Refreshes the whole accessed path; victims are the oldest evictable nodes.

    Ties break toward the deeper node so leaves go before their ancestors.
    """

    name = "lru"

    def on_access(self, path: Sequence[Node], now: float) -> None:
        for node in path:
            node.last_access = now

    def next_victim(self, kind: ObjectKind) -> Node | None:
        best: Node | None = None
        for node in self.tree.nodes():
            if not self.evictable(node, kind):
                continue
            if best is None or (node.last_access, -node.depth) < (best.last_access, -best.depth):
                best = node
        return best
