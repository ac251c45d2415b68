"""Radix-tree paths for the eviction tests: sessions as chains of KV with states at given
depths, sized as Marconi-7B's (a state weighs the KV of ~786 tokens)."""

from __future__ import annotations

import numpy as np

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.tree.radix import Node, ObjectRef, RadixTree

GEO = get_preset("marconi-7b")
KV = GEO.kv_bytes_per_token()


def ref(kind: ObjectKind, start: int, end: int, nbytes: int) -> ObjectRef:
    return ObjectRef(ObjectKey("fp", bytes(16), kind, start, end), nbytes)


def chain(tree: RadixTree, tokens: np.ndarray, state_at: tuple[int, ...]) -> list[Node]:
    """``tokens`` as a path with its KV, a state at each depth of ``state_at``."""
    nodes = []
    for d in state_at:
        node = tree.insert(tokens[:d])
        start = node.parent.depth if node.parent is not None else 0
        tree.add_kv(node, ref(ObjectKind.KV, start, d, (d - start) * KV))
        tree.set_state(node, ref(ObjectKind.STATE, d, d, GEO.state_bytes()))
        nodes.append(node)
    return nodes
