"""The terms of Marconi's utility and candidacy, as pure functions of a node and numbers
(shared by the incremental ``MarconiEviction`` and the full-walk reference)."""

from __future__ import annotations

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tree.radix import Node


def recency(now: float, last_access: float) -> float:
    """Marconi's recency score, ``1 / max(now - last_access, 1)`` (1 for the newest)."""
    return 1.0 / max(now - last_access, 1.0)


def utility(
    r: float, e: float, rmin: float, rmax: float, emin: float, emax: float, alpha: float
) -> float:
    """``norm(r) + alpha * norm(e)``, min-max normalised (a constant term normalises to 0)."""
    nr = (r - rmin) / (rmax - rmin) if rmax > rmin else 0.0
    ne = (e - emin) / (emax - emin) if emax > emin else 0.0
    return nr + alpha * ne


def product_utility(r: float, e: float, emin: float, emax: float, alpha: float) -> float:
    """``recency * (1 + alpha * norm(e))``: efficiency buys at most a factor ``1 + alpha``
    of age, so a dead node ages out whatever its efficiency (GreedyDual-Size-like), where
    the additive form keeps the top-efficiency node for ever once ``alpha`` exceeds the
    recency spread (1). Monotone in both terms, like ``utility``."""
    ne = (e - emin) / (emax - emin) if emax > emin else 0.0
    return r * (1.0 + alpha * ne)


def base_depth(node: Node) -> int:
    """Depth a hit falls back to if ``node`` is evicted: its nearest ancestor that keeps
    existing on its own (holds a state, branches, or is the root). Stateless single-child
    ancestors in between (chunk-boundary splits) are released with the node, so the node's
    value and freed bytes are measured over ``[base_depth, depth)``."""
    cur = node.parent
    while cur is not None and cur.parent is not None and cur.state is None and len(cur.children) == 1:
        cur = cur.parent
    return cur.depth if cur is not None else 0


def structural_key(node: Node) -> tuple[int, int, bool, bool]:
    """The accounting's arguments for ``node``: (depth, base depth, has state, is leaf)."""
    return (node.depth, base_depth(node), node.state is not None, not node.children)


def eligible(node: Node, kind: ObjectKind) -> bool:
    """Structural candidacy (locks are the cache's ``evictable`` concern)."""
    if kind is ObjectKind.KV:
        return not node.children
    if kind is ObjectKind.STATE:
        return node.state is not None and len(node.children) <= 1
    return bool(node.anchors)
