"""Victim rules ``MarconiEviction`` applies around its utility ranking when built with
``scan_resistant=True`` (a mixin: the state is the policy's own; off, the policy ranks as
before and only keeps the bookkeeping).

* **Stranded KV first** (``stranded``): a leaf whose state this policy evicted holds KV
  no hit can use; it is the first KV victim, and with KV and states in one budget KV goes
  first while such a leaf exists.
* **Whole leaves in a shared budget**: when the state victim is a leaf, evicting its state
  alone strands its KV in the same budget, so the KV victim (a whole leaf, state included)
  goes first instead.
* **Scan resistance** (``scan_guard.ScanGuard``, ARC's classes and ghosts): the ranking
  runs over the class the guard names first (unproven prefixes while they hold more than
  its adaptive target, else proven ones), falling back to the other class when that one
  has no evictable candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies.base import Evictable
from hybrid_connector.policies.eviction.scan_guard import ScanGuard
from hybrid_connector.policies.eviction.stranded import is_stranded
from hybrid_connector.tree.radix import Node, RadixTree


def first_kind(kind: ObjectKind, kinds: Sequence[ObjectKind]) -> tuple[ObjectKind, ...]:
    """``kinds`` with ``kind`` moved to the front."""
    return (kind, *(k for k in kinds if k is not kind))


class VictimRules:
    """The rules above, over the policy's ``_choose`` (see module docstring)."""

    tree: RadixTree
    evictable: Evictable
    scan_resistant: bool
    _stranded: set[int]
    guard: ScanGuard
    _may: Evictable
    _only: bool | None

    def _choose(self, kind: ObjectKind) -> Node | None:
        raise NotImplementedError

    def _bind_rules(self, evictable: Evictable) -> None:
        self._stranded = set()
        self.guard = ScanGuard()
        self._may = evictable
        self._only = None  # the class the ranking is restricted to (None: both)
        self.evictable = self._filtered

    def _filtered(self, node: Node, kind: ObjectKind) -> bool:
        return self._may(node, kind) and (self._only is None
                                          or self.guard.is_proven(node) is self._only)

    def _choose_guarded(self, kind: ObjectKind) -> Node | None:
        """``_choose`` over the class the guard evicts first, then over both."""
        if self.scan_resistant and kind is not ObjectKind.ANCHOR:
            self._only = self.guard.victim_class()
            if self._only is None:
                return self._choose(kind)
            try:
                got = self._choose(kind)
            finally:
                self._only = None
            if got is not None:
                return got
        return self._choose(kind)

    def _whole_leaf(self, order: Sequence[ObjectKind], kinds: Sequence[ObjectKind]
                    ) -> Sequence[ObjectKind]:
        """``order``, unless it takes a state first whose node is a leaf (see module
        docstring): then KV first."""
        if order[0] is not ObjectKind.STATE or not self.scan_resistant:
            return order
        node = self._choose_guarded(ObjectKind.STATE)
        if node is None or node.children or not self.evictable(node, ObjectKind.KV):
            return order
        return first_kind(ObjectKind.KV, kinds)

    def _stranded_victim(self) -> Node | None:
        """The least recent evictable leaf among those whose state this policy evicted and
        whose KV still serves no hit (``stranded.is_stranded``); marks that no longer hold
        (a state saved again, a child added) are dropped."""
        best: Node | None = None
        if not self.scan_resistant:
            return None
        for nid in list(self._stranded):
            node = self.tree.node(nid)
            if node is None or not is_stranded(node):
                self._stranded.discard(nid)
                continue
            if self.evictable(node, ObjectKind.KV) and (
                    best is None or (node.last_access, nid) < (best.last_access, best.id)):
                best = node
        return best
