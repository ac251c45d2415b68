"""The hit rule: one finder per object kind and the coordinator that combines them.

A usable hit of length p needs KV for every attention layer over ``[0, p)`` (nothing for a
model without attention layers) and a recurrent state at exactly p (nothing for a model
without recurrent layers): a checkpoint at p (exact), or anchor pages covering the
replay window before p (approximate, only with replay). p is below the prompt length and a
multiple of the alignment. The finders read the tree and never mutate it; ``usable(key)``
says which stored objects may be planned (ready, not lost).

* ``kv_chain``: KV chunks covering ``[0, reach)`` contiguously from 0. A chunk that runs
  past the match still serves its matched part (KV at position i depends only on tokens
  ``[0, i]``), so chunks below the match point that start before it are candidates.
* ``best_state``: the deepest node on the matched path holding a usable checkpoint at an
  aligned depth within the KV reach.
* ``replay_window``: the deepest page end p whose replay window is covered by whole anchor
  pages, contiguously.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.tree.radix import MatchResult, Node, ObjectRef

Usable = Callable[[ObjectKey], bool]


class UsableNow:
    """``usable`` for a search now: neither in flight (pending) nor doomed, given the
    index's live sets (``StateTable.unusable_sets``, read under its lock). Remembers
    whether the search asked about an in-flight key that is not doomed
    (``met_pending``): only then can a search that counts in-flight objects as landed
    (``once_landed``) find more; else it would retrace this one, call for call."""

    __slots__ = ("in_flight", "lost", "met_pending")

    def __init__(self, in_flight: AbstractSet[ObjectKey], doomed: AbstractSet[ObjectKey]) -> None:
        self.in_flight, self.lost, self.met_pending = in_flight, doomed, False

    def __call__(self, key: ObjectKey) -> bool:
        if key in self.in_flight:
            self.met_pending = self.met_pending or key not in self.lost
            return False
        return key not in self.lost

    def once_landed(self, key: ObjectKey) -> bool:
        return key not in self.lost


@dataclass(frozen=True)
class Hit:
    """What the coordinator found: hit length ``p`` (0: miss), the node holding p, the KV
    chunks to load (in order), the checkpoint or the anchors, and how far KV alone reaches."""

    p: int
    node: Node | None
    kv: tuple[ObjectRef, ...]
    state: ObjectRef | None
    anchors: tuple[ObjectRef, ...]
    kv_reach: int


def kv_candidates(m: MatchResult, max_kv_len: int) -> list[Node]:
    """Nodes whose KV chunks may serve the match: the matched path, the partially matched
    node, and descendants below the match point whose chunks can start before it."""
    nodes = list(m.path)
    frontier = [m.partial] if m.partial is not None else list(m.node.children.values())
    bound = m.length + max_kv_len
    while frontier:
        node = frontier.pop()
        nodes.append(node)
        frontier.extend(c for c in node.children.values() if c.start < bound)
    return nodes


def kv_chain(m: MatchResult, max_kv_len: int, usable: Usable | None, *,
             needs_kv: bool = True) -> tuple[list[ObjectRef], int]:
    """Usable KV chunks covering ``[0, reach)`` from 0 (the longest chunk per start), and
    ``reach`` capped at the match length. A model without attention layers (``needs_kv``
    False: a pure state-space LM) needs no KV: no chunks, and the reach is the match.
    ``usable`` None: every chunk is usable. ``usable`` is asked only of chunks that would
    be taken (start before the match, longer than the best usable one with that start)."""
    matched = m.length
    if not needs_kv:
        return [], matched
    by_start: dict[int, ObjectRef] = {}
    for node in kv_candidates(m, max_kv_len):
        for ref in node.kv.values():
            start = ref.start
            if start < matched:
                old = by_start.get(start)
                if (old is None or old.end < ref.end) and (usable is None or usable(ref.key)):
                    by_start[start] = ref
    chain: list[ObjectRef] = []
    reach = 0
    while reach < matched:
        nxt = by_start.get(reach)
        if nxt is None:
            break
        chain.append(nxt)
        reach = nxt.end
    return chain, min(reach, matched)


def best_state(path: Sequence[Node], limit: int, align: int, usable: Usable) -> Node | None:
    """Deepest node of ``path`` with a usable checkpoint at an aligned depth <= limit."""
    best: Node | None = None
    for node in path:
        if (node.state is not None and node.depth <= limit and node.depth % align == 0
                and (best is None or node.depth > best.depth) and usable(node.state.key)):
            best = node
    return best


def replay_window(nodes: Sequence[Node], limit: int, align: int, exact_p: int, page: int,
                  budget_frac: float, max_tokens: int, usable: Usable
                  ) -> tuple[int, list[ObjectRef]] | None:
    """Deepest page end p > exact_p (aligned, <= limit) whose replay window ``[start, p)``
    is covered by whole anchor pages ``[e - page, e)``, none missing."""
    anchors = {e: r for n in nodes for e, r in n.anchors.items()
               if e <= limit and r.start == e - page and r.start % page == 0 and usable(r.key)}
    for p in sorted(anchors, reverse=True):
        if p <= exact_p or p % align or p % page:
            continue
        window = min(int(budget_frac * p), max_tokens)
        window = max(page, window - window % page)
        start = max(0, p - window)
        pages = [anchors.get(e) for e in range(start + page, p + 1, page)]
        if pages and all(r is not None for r in pages):
            return p, [r for r in pages if r is not None]
    return None


def find_hit(m: MatchResult, prompt_len: int, align: int, *, needs_state: bool,
             max_kv_len: int, usable: Usable, replay: bool, page: int, budget_frac: float,
             max_tokens: int, root: Node, needs_kv: bool = True) -> Hit:
    """The coordinator: the longest hit for a prompt of ``prompt_len`` tokens whose radix
    match is ``m``, under the hit rule (see the module docstring). ``needs_state`` False
    (attention-only model): the KV reach alone is the hit; ``needs_kv`` False (state-only
    model): every hit is a checkpoint (or a replay), found along the whole match."""
    limit = min(m.length, prompt_len - 1)
    if limit <= 0:
        return Hit(0, None, (), None, (), 0)
    chain, reach = kv_chain(m, max_kv_len, usable, needs_kv=needs_kv)
    cap = min(limit, reach)
    if not needs_state:
        p = cap - cap % align
        node = m.path[-1] if m.path else root
        return Hit(p, node if p else None, tuple(r for r in chain if r.start < p), None, (), reach)
    exact = best_state(m.path, cap, align, usable)
    exact_p = exact.depth if exact is not None else 0
    if replay:
        nodes = list(m.path) + ([m.partial] if m.partial is not None else [])
        found = replay_window(nodes, cap, align, exact_p, page, budget_frac, max_tokens, usable)
        if found is not None:
            p, anchors = found
            holder = next(n for n in nodes if n.start < p <= n.depth)
            return Hit(p, holder, tuple(r for r in chain if r.start < p), None, tuple(anchors),
                       reach)
    if exact is None:
        return Hit(0, None, (), None, (), reach)
    return Hit(exact_p, exact, tuple(r for r in chain if r.start < exact_p), exact.state, (),
               reach)
