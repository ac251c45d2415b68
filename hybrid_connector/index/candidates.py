"""Shallower hits than the deepest one: what a load gate may fall back to.

``HybridCache.lookup`` returns only the deepest usable hit. A hit ends where a recurrent
state is stored (or, for a model without recurrent layers, where a KV chunk ends), so every
usable checkpoint further up the prompt's matched path is a shallower exact hit, whose
objects may sit on faster tiers. Pure: reads the index under its lock, like ``lookup``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hybrid_connector.core.keys import as_tokens
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.plan import LoadPlan


def hit_positions(index: CacheIndex, tokens: Sequence[int] | np.ndarray, above: int,
                  below: int, alignment: int, limit: int = 8) -> list[int]:
    """Positions q with ``above < q < below``, multiples of ``alignment``, where an exact
    hit may end (a usable checkpoint on the matched path; KV chunk ends for a model without
    recurrent layers), deepest first, at most ``limit`` of them."""
    arr = as_tokens(tokens)
    with index.lock:
        m = index.tree.match_tokens(arr)
        if index.needs_state:
            qs = {n.depth for n in m.path
                  if n.state is not None and index.table.usable(n.state.key)}
        else:
            qs = {r.end for n in m.path for r in n.kv.values() if index.table.usable(r.key)}
    return sorted((q for q in qs if above < q < below and q % alignment == 0),
                  reverse=True)[:limit]


def shallower_plans(index: CacheIndex, tokens: Sequence[int] | np.ndarray, plan: LoadPlan,
                    above: int, alignment: int, limit: int = 8) -> list[LoadPlan]:
    """Exact plans (``lookup_at``) for the hits shallower than ``plan`` and deeper than
    ``above`` (``hit_positions``), deepest first; positions whose objects are not all
    readable now are left out."""
    out = []
    for q in hit_positions(index, tokens, above, plan.num_tokens, alignment, limit):
        got = index.lookup_at(tokens, q, alignment=alignment)
        if got.hit and got.exact:
            out.append(got)
    return out
