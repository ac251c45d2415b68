"""Marconi eviction: utility = norm(recency) + alpha * norm(FLOPs saved / byte).

Candidates (Marconi, MLSys'25) are nodes with at most one child: for ``ObjectKind.KV`` the
unlocked leaves (evicting one frees its KV, state and anchors), for ``ObjectKind.STATE``
the nodes with a state and at most one child (evicting frees only the state; the cache then
merges a stateless single-child node into its child, or prunes a dead leaf). Both terms are
min-max normalised over the evictable candidates of that kind; recency is
``1 / max(now - last_access, 1)`` on the logical clock of ``on_access``; the lowest utility
goes, ties broken by the smaller node id. Only the last node of an accessed path is
refreshed (Marconi); ``refresh_path=True`` refreshes the whole path (SGLang-style LRU when
alpha is 0). ``ObjectKind.ANCHOR`` victims are the least recently used nodes with anchors.

Incremental structure (why one eviction does not walk the tree): per kind, two sorted lists
of candidates (``sortedcontainers.SortedList`` of ``(key, node id)``, so ties break by the
smaller id), by ``last_access`` and by cached efficiency. A victim is found with a
threshold scan (Fagin's TA) down both lists at once: a node not yet seen in either list has
recency >= the next unseen recency and efficiency >= the next unseen efficiency, and
utility is monotone in both (IEEE rounding is monotone too), so the scan stops as soon as
that bound exceeds the best utility seen: the result equals a full walk's
(``FullWalkMarconi``, the O(N) reference, tested to choose the same victims). Entries are
refreshed lazily from a dirty set fed by ``on_access``/``on_change``/``on_remove``, the
parents of removed nodes, the previous victim, and nodes the tree created since the last
sync (splits and inserts are not reported to policies, so new node ids are picked up from
the tree's id counter: a new node, its parent and its children are refreshed).

Alpha: a float, or ``None`` for auto: 0 (pure recency, i.e. LRU) until a tuner reports a
result (``tuner.py``: an alpha from window replays; ``shadow_tuner.py``: an alpha and a
refresh mode from twin caches); the policy then adopts it. A tuner built late (by
``tuner_factory`` at the first eviction) is first fed the requests kept until then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
from sortedcontainers import SortedList

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.policies.base import Evictable, EvictionPolicy
from hybrid_connector.policies.eviction.accounting import Accounting, CorrectedAccounting
from hybrid_connector.policies.eviction.marconi_order import move_entry
from hybrid_connector.policies.eviction.marconi_terms import (
    base_depth,
    eligible,
    product_utility,
    recency,
    structural_key,
    utility,
)
from hybrid_connector.policies.eviction.marconi_victims import VictimRules, first_kind
from hybrid_connector.policies.tuning.base import Tuner
from hybrid_connector.policies.tuning.marconi_mixin import TunedSetting, TunerFactory
from hybrid_connector.tree.radix import Node, RadixTree

__all__ = ["MarconiEviction", "base_depth", "eligible", "product_utility", "recency",
           "structural_key", "utility"]

_RANKED = (ObjectKind.KV, ObjectKind.STATE)
PRELOG = 4000  # requests kept for a tuner built at the first eviction


_KV, _STATE, _ANCHOR = ObjectKind.KV, ObjectKind.STATE, ObjectKind.ANCHOR


class _Entry:
    __slots__ = ("node", "skey", "eff", "parent_id", "keys", "status")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.status: tuple[bool, int] | None = None  # (has state, children) last seen
        self.skey: tuple[int, int, bool, bool] | None = None
        self.eff = 0.0
        self.parent_id = -1
        self.keys: dict[ObjectKind, tuple[float, float]] = {}  # kind -> (last, eff) indexed


class MarconiEviction(VictimRules, TunedSetting, EvictionPolicy):
    """Marconi's FLOP-aware eviction with an incremental candidate index.

    ``accounting``: built from the geometry at ``bind`` (default ``CorrectedAccounting``).
    ``alpha``: fixed weight, or ``None`` for auto-tuning (``tuner`` or ``tuner_factory``
    needed for it to ever change from 0). ``next_victim`` never mutates the tree; it may set
    ``last_access`` of nodes created since the last call (new objects count as fresh).
    """

    name = "marconi"

    def __init__(
        self,
        alpha: float | None = None,
        accounting: Callable[[ModelGeometry], Accounting] = CorrectedAccounting,
        refresh_path: bool = False,
        tuner: Tuner | None = None,
        tuner_factory: TunerFactory | None = None,
        joint_pool: bool = False,
        score: str = "sum",
        scan_resistant: bool = False,
        fallback_first: bool = False,
    ) -> None:
        if alpha is not None and alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if score not in ("sum", "product"):
            raise ValueError(f"score must be 'sum' or 'product', got {score!r}")
        self.score = score
        self.auto = alpha is None
        self.alpha = 0.0 if alpha is None else float(alpha)
        self._accounting_factory = accounting
        self.refresh_path = refresh_path
        self.joint_pool = joint_pool
        self.scan_resistant = scan_resistant
        self.fallback_first = fallback_first  # marconi_victims: off until it is safe
        self.tuner: Tuner | None = None
        self._tuner_factory = tuner_factory
        self._prelog: deque[tuple[np.ndarray, int]] = deque(maxlen=PRELOG)
        if tuner is not None:
            self._attach(tuner)
        self.alpha_history: list[tuple[int, float]] = []  # (requests seen, alpha adopted)
        self.evictions = 0
        self.scanned = 0  # entries examined by next_victim (benchmark counter)

    # ------------------------------------------------------------------ binding
    def bind(self, tree: RadixTree, geometry: ModelGeometry, evictable: Evictable) -> None:
        super().bind(tree, geometry, evictable)
        self.accounting = self._accounting_factory(geometry)
        self._entries: dict[int, _Entry] = {}
        self._by_time: dict[ObjectKind, SortedList] = {k: SortedList() for k in ObjectKind}
        self._by_eff: dict[ObjectKind, SortedList] = {k: SortedList() for k in _RANKED}
        self._dirty: set[int] = set()
        self._seen_id = 1
        self._now = 0.0
        self._requests = 0
        self._bind_rules(evictable)
        self._shadow_pick = None

    # -------------------------------------------------------------------- hooks
    def on_access(self, path: Sequence[Node], now: float) -> None:
        self._now = max(self._now, now)
        self._sync()
        touched = path if self.refresh_path else path[-1:]
        for node in touched:
            node.last_access = now
            self._refresh(node)
        if path:
            self._note_access(path[-1])
            self.guard.used(path[-1])
            self._dirty.add(path[-1].id)  # a hit counts ``hits`` after this call returns

    def on_change(self, node: Node) -> None:
        self._dirty.add(node.id)

    def on_remove(self, node_id: int) -> None:
        self._stranded.discard(node_id)
        self.guard.removed(node_id)
        entry = self._entries.pop(node_id, None)
        if entry is None:
            return
        self._unindex(entry)
        self._dirty.add(entry.parent_id)
        self._dirty.discard(node_id)

    # ----------------------------------------------------------------- choosing
    def next_victim(self, kind: ObjectKind) -> Node | None:
        self._sync()
        if kind is not ObjectKind.ANCHOR:
            self._first_eviction()
        victim = self._stranded_victim() if kind is ObjectKind.KV else None
        pick, self._shadow_pick = self._shadow_pick, None  # set by ``victim_kinds``
        if kind is ObjectKind.STATE and pick is not None and self.tree.node(pick.id) is pick:
            victim = pick
        if victim is None:
            victim = self._choose_guarded(kind)
        if victim is not None:
            if kind is ObjectKind.STATE and not victim.children:
                self._stranded.add(victim.id)  # its KV serves no hit once the state is gone
            if kind is ObjectKind.KV:
                self.guard.evicting(victim)
            self.evictions += 1
            self._dirty.add(victim.id)
            if victim.parent is not None:
                self._dirty.add(victim.parent.id)
        return victim

    def victim_kinds(self, kinds: Sequence[ObjectKind]) -> Sequence[ObjectKind]:
        """With ``joint_pool`` and KV and states in one budget: the kind whose best victim
        has the lower utility under one normalisation over both kinds' candidates goes
        first (the reference's single pool: a dead intermediate checkpoint competes with
        leaves, instead of leaving only when a state save overflows). Each kind's victim is
        its own minimum, compared jointly (exact for alpha 0; an approximation otherwise)."""
        if not {ObjectKind.KV, ObjectKind.STATE} <= set(kinds):
            return kinds
        self._sync()
        if self._stranded_victim() is not None:
            return first_kind(ObjectKind.KV, kinds)  # bytes no hit can use go before any other
        if not self.joint_pool:
            order = self._whole_leaf(kinds, kinds)
            return first_kind(ObjectKind.STATE, kinds) if self._fallback_first(order) else order
        best: dict[ObjectKind, tuple[float, float]] = {}
        t_ends: list[float] = []
        e_ends: list[float] = []
        for k in _RANKED:
            node = self._choose_guarded(k)
            te, ee = self._evictable_ends(self._by_time[k], k), self._evictable_ends(self._by_eff[k], k)
            if node is None or te is None or ee is None or node.id not in self._entries:
                continue
            best[k] = self._entries[node.id].keys.get(k, (node.last_access, 0.0))
            t_ends += te
            e_ends += ee
        if len(best) < 2:
            return kinds
        now = self._now
        rmin, rmax = recency(now, min(t_ends)), recency(now, max(t_ends))
        emin, emax = min(e_ends), max(e_ends)
        u = {k: self._utility(recency(now, last), eff, rmin, rmax, emin, emax, self.alpha)
             for k, (last, eff) in best.items()}
        first = min(u, key=lambda k: (u[k], k is not kinds[0]))
        return self._whole_leaf(first_kind(first, kinds), kinds)

    def _utility(self, r: float, e: float, rmin: float, rmax: float, emin: float, emax: float,
                 alpha: float) -> float:
        if self.score == "product":
            return product_utility(r, e, emin, emax, alpha)
        return utility(r, e, rmin, rmax, emin, emax, alpha)

    def _choose(self, kind: ObjectKind) -> Node | None:
        if kind is ObjectKind.ANCHOR:
            return self._first_evictable(self._by_time[kind], kind)
        return self._threshold_scan(kind)

    def _first_evictable(self, items: SortedList, kind: ObjectKind) -> Node | None:
        """The first evictable node in ``items`` order (counted in ``scanned``)."""
        for _, nid in items:
            node = self._entries[nid].node
            self.scanned += 1
            if self.evictable(node, kind):
                return node
        return None

    def _evictable_ends(self, items: SortedList, kind: ObjectKind) -> tuple[float, float] | None:
        """Lowest and highest evictable key of ``items`` (scanned from both ends), or None."""
        def keys(it: Iterable[tuple[float, int]]) -> Iterator[float]:
            return (v for v, nid in it if self.evictable(self._entries[nid].node, kind))

        lo = next(keys(items), None)
        return None if lo is None else (lo, next(keys(reversed(items))))

    def _threshold_scan(self, kind: ObjectKind) -> Node | None:
        times, effs = self._by_time[kind], self._by_eff[kind]
        t_ends = self._evictable_ends(times, kind)
        if t_ends is None:
            return self._fallback(kind)
        now, alpha = self._now, self.alpha
        if alpha == 0.0:
            # Utility is normalised recency alone: the minimum is the first evictable entry
            # in (last_access, id) order, which is exactly the (utility, id) minimum.
            return self._first_evictable(times, kind)
        e_ends = self._evictable_ends(effs, kind)
        assert e_ends is not None
        rmin, rmax = recency(now, t_ends[0]), recency(now, t_ends[1])
        emin, emax = e_ends
        best: tuple[float, int] | None = None
        best_node: Node | None = None
        seen: set[int] = set()
        # Both lists hold the same candidates; walk them in step with iterators (indexing a
        # SortedList is O(log n)), t/e being the next unseen entry of each.
        t_it: Iterator[tuple[float, int]] = iter(times)
        e_it: Iterator[tuple[float, int]] = iter(effs)
        t: tuple[float, int] | None = next(t_it, None)
        e: tuple[float, int] | None = next(e_it, None)
        while t is not None or e is not None:
            for item in (t, e):
                if item is None:
                    continue
                nid = item[1]
                if nid in seen:
                    continue
                seen.add(nid)
                entry = self._entries[nid]
                self.scanned += 1
                if not self.evictable(entry.node, kind):
                    continue
                last, eff = entry.keys[kind]
                u = self._utility(recency(now, last), eff, rmin, rmax, emin, emax, alpha)
                if best is None or (u, nid) < best:
                    best, best_node = (u, nid), entry.node
            t, e = next(t_it, None), next(e_it, None)
            if best is not None and t is not None and e is not None:
                bound = self._utility(recency(now, t[0]), e[0], rmin, rmax, emin, emax, alpha)
                if bound > best[0]:
                    break
        return best_node

    def _fallback(self, kind: ObjectKind) -> Node | None:
        """No evictable candidate with <= 1 child: the least recent evictable holder of
        ``kind`` anywhere (an O(N) walk, only when the candidate lists are exhausted). None
        in a pass restricted to the guard's class (``_only``): a branch point's state (a
        shared prefix's) goes only once no class has a candidate left."""
        if kind is not ObjectKind.STATE or self._only is not None:
            return None
        best: tuple[float, int] | None = None
        out = None
        for node in self.tree.nodes():
            if node.state is not None and self.evictable(node, kind):
                key = (node.last_access, node.id)
                if best is None or key < best:
                    best, out = key, node
        return out

    # ------------------------------------------------------------ index upkeep
    def _sync(self) -> None:
        """Pick up nodes the tree created since the last sync, then refresh dirty ones."""
        next_id = self.tree.next_id  # see module docstring
        created = [n for n in map(self.tree.node, range(self._seen_id, next_id)) if n is not None]
        if created:
            self.guard.created(created, self._seen_id, self._now)
        for new in created:
            new.last_access = max(new.last_access, self._now)
            self._dirty.add(new.id)
            if new.parent is not None:
                self._dirty.add(new.parent.id)
            self._dirty_chain_below(new)
        self._seen_id = max(self._seen_id, next_id)
        while self._dirty:
            nid = self._dirty.pop()
            node = self.tree.node(nid)
            if node is None or node is self.tree.root:
                entry = self._entries.pop(nid, None)
                if entry is not None:
                    self._unindex(entry)
                continue
            self._refresh(node)

    def _refresh(self, node: Node) -> None:
        # ``structural_key`` and ``eligible`` inlined (the hot path of every sync)
        nid = node.id
        entry = self._entries.get(nid)
        if entry is None:
            entry = self._entries[nid] = _Entry(node)
        cur = node.parent
        assert cur is not None
        entry.parent_id, tb = cur.id, self.tree.bytes
        self.guard.refresh(node, tb[_KV] + tb[_STATE], self._now)
        n, has_state = len(node.children), node.state is not None
        status = (has_state, n if n < 2 else 2)
        while cur.parent is not None and cur.state is None and len(cur.children) == 1:
            cur = cur.parent  # base_depth: the nearest ancestor standing on its own
        skey = (node.depth, cur.depth, has_state, not n)
        old = entry.status
        if old is not None and (status != old or (
                status == (False, 1) and entry.skey is not None and skey[1] != entry.skey[1])):
            self._dirty_chain_below(node)  # chains below walk through this node
        entry.status = status
        if skey != entry.skey:
            entry.skey = skey
            entry.eff = self.accounting.efficiency(*skey)
        on, keys = (node.last_access, entry.eff), entry.keys
        for kind, ok in ((_KV, not n), (_STATE, has_state and n <= 1),
                         (_ANCHOR, bool(node.anchors))):
            want = on if ok else None
            have = keys.get(kind)
            if want == have:
                continue
            move_entry(self._by_time[kind], self._by_eff.get(kind), have, want, nid)
            if want is None:
                del keys[kind]
            else:
                keys[kind] = want

    def _dirty_chain_below(self, node: Node) -> None:
        """``node`` changed whether it stands on its own: descendants whose ``base_depth``
        walks through it (down chains of stateless single-child nodes) need a refresh."""
        stack = list(node.children.values())
        while stack:
            c = stack.pop()
            self._dirty.add(c.id)
            if c.state is None and len(c.children) == 1:
                stack.extend(c.children.values())

    def _unindex(self, entry: _Entry) -> None:
        for kind, key in entry.keys.items():
            move_entry(self._by_time[kind], self._by_eff.get(kind), key, None, entry.node.id)
        entry.keys = {}

    def candidates(self, kind: ObjectKind) -> Iterable[Node]:
        """Indexed candidates of ``kind`` (for inspection and tests)."""
        self._sync()
        return [self._entries[nid].node for _, nid in self._by_time[kind]]

