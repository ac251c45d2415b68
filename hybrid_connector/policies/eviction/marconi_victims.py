"""Victim rules ``MarconiEviction`` applies around its utility ranking when built with
``scan_resistant=True`` (a mixin: the state is the policy's own; off, the policy ranks as
before and only keeps the bookkeeping).

* **Stranded KV first** (``stranded``): a leaf whose state this policy evicted holds KV
  no hit can use; it is the first KV victim, and with KV and states in one budget KV goes
  first while such a leaf exists.
* **Whole leaves in a shared budget**: when the state victim is a leaf, evicting its state
  alone strands its KV in the same budget, so the KV victim (a whole leaf, state included)
  goes first instead.
* **Fallback states before KV in a shared budget** (``fallback_first``, config key
  ``fallback_states``, off by default: see the limit below; ``shadowed``): when KV would go
  first (a KV save needs room), a state whose single-child chain below holds a deeper
  state goes first instead, least recent first. Such a state serves only a request that
  leaves the chain between it and the deeper one (a retry, an edit); evicting a leaf
  instead takes a whole prefix's deepest hit. Each turn of a chat or an agent leaves one
  (the prompt's checkpoint, then the answer's end state), and a state weighs as much KV
  as ~100 tokens (Qwen3.5), so under kind order they filled the pool: measured on the
  vLLM head-to-head at 1x the working set, agents 0.831 -> 0.859, chat_edits 0.733 ->
  0.780, multiround_qa 0.402 -> 0.491; at 4x unchanged (0.950, 0.918). Limit: a client
  that does not resend the answer diverges at the prompt's end, whose checkpoint this
  takes before the answer's state (the stored answer then serves no hit): the scan
  tests' users (``tests/policies/test_scan_and_stranded.py``) do that and lose half their
  hits, which is why it is its own key (``fallback_states``), on in ``configs/vllm*.yaml``
  only, where ``AnswerGate`` stores answers only while later prompts resend them.
  **Weighed by where hits land**: such a state goes first only while the KV it keeps
  usable (its tokens above the next state or branch up, ``base_depth``) times the share
  of state hits that landed on fallback states (``(fallback hits + 1) / (state hits +
  1)``, counted at each access) is below what its bytes would hold in KV
  (``state_bytes / kv_bytes_per_token`` tokens). Chat and agents hit the deepest state
  (the share falls towards 0: every fallback goes first, as before); in the Mooncake
  replay the next turn drops the previous prompt's partial last block, so hits land on the
  block-floored prompt-end state above the exact-end one, and taking it first lost those
  hits (head-to-head at 2x: 0.256 -> 0.268). **Branches off a chain count too**: an
  access whose path branches off a chain at a node without a state (a retry or an edit
  leaving the chain between two states; the chain goes on to a state) counts once per
  such branch as a state hit that landed on a fallback: the hit a fallback state there
  would have served (counting only hits that landed made the share self-fulfilling: with
  the fallbacks gone, a retry hits far above and never counts). One request at a time,
  agents at 1x: their retries leave the chain inside the last action and observation
  (head-to-head 0.857 -> 0.869); chat_edits at 1x unchanged (0.791).
* **Scan resistance** (``scan_guard.ScanGuard``, ARC's classes and ghosts): the ranking
  runs over the class the guard names first (unproven prefixes while they hold more than
  its adaptive target, else proven ones), falling back to the other class when that one
  has no evictable candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sortedcontainers import SortedList

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.policies.base import Evictable
from hybrid_connector.policies.eviction.marconi_terms import base_depth
from hybrid_connector.policies.eviction.scan_guard import ScanGuard
from hybrid_connector.policies.eviction.stranded import is_stranded
from hybrid_connector.tree.coverage import path_reach
from hybrid_connector.tree.radix import Node, RadixTree

# states looked at (least recent first) for a fallback one per eviction: bounds the cost
# on the caller's thread; an older fallback state further down waits for a later eviction
FALLBACK_SCAN = 64


def shadowed(node: Node, settled: Callable[[Node], bool] = lambda n: True) -> bool:
    """``node`` has one child and its single-child chain below reaches a node with a state
    before any branch (one ``settled`` accepts: a hit can land there, its KV is whole
    down to it): a hit that gets as far as ``node`` goes on to that deeper state
    unless it leaves the chain in between, so ``node``'s state is a fallback only."""
    n = node
    while len(n.children) == 1:
        n = next(iter(n.children.values()))
        if n.state is not None and settled(n):
            return True
    return False


def reaches_state(node: Node) -> bool:
    """``node`` or its single-child chain below holds a state (before any branch)."""
    n = node
    while n.state is None:
        if len(n.children) != 1:
            return False
        n = next(iter(n.children.values()))
    return True


def first_kind(kind: ObjectKind, kinds: Sequence[ObjectKind]) -> tuple[ObjectKind, ...]:
    """``kinds`` with ``kind`` moved to the front."""
    return (kind, *(k for k in kinds if k is not kind))


class VictimRules:
    """The rules above, over the policy's ``_choose`` (see module docstring)."""

    tree: RadixTree
    geometry: ModelGeometry
    evictable: Evictable
    scan_resistant: bool
    fallback_first: bool
    _stranded: set[int]
    guard: ScanGuard
    _may: Evictable
    _only: bool | None
    _by_time: dict[ObjectKind, SortedList]
    _entries: dict[int, Any]
    _shadow_pick: Node | None

    def _choose(self, kind: ObjectKind) -> Node | None:
        raise NotImplementedError

    def _bind_rules(self, evictable: Evictable) -> None:
        self._stranded = set()
        self.guard = ScanGuard()
        self._may = evictable
        self._only = None  # the class the ranking is restricted to (None: both)
        self._state_hits = 0  # hits that landed on a state ...
        self._fallback_hits = 0  # ... of which on a fallback state (``shadowed``)
        self._last_access: tuple[Node, int, bool] | None = None
        self._branches: set[int] = set()  # branch nodes counted by ``_note_branch``
        self.evictable = self._filtered

    def _filtered(self, node: Node, kind: ObjectKind) -> bool:
        return self._may(node, kind) and (self._only is None
                                          or self.guard.is_proven(node) is self._only)

    def _choose_guarded(self, kind: ObjectKind) -> Node | None:
        """``_choose`` over the class the guard evicts first, then over both; a state at a
        branch point (``_fallback``) is taken only in the pass over both."""
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

    def _fallback_first(self, order: Sequence[ObjectKind]) -> bool:
        """With KV first in ``order``: whether a fallback state goes before it (module
        docstring); the one found is what ``next_victim(STATE)`` returns next."""
        self._shadow_pick = None
        if not (self.scan_resistant and self.fallback_first) or order[0] is not ObjectKind.KV:
            return False
        self._settle_access()
        # a fallback state is worth its bytes when the KV it keeps usable (its tokens above
        # the next state or branch up), times the share of state hits that land on
        # fallbacks, outweighs the tokens of KV its bytes would hold (module docstring)
        kv = self.geometry.kv_bytes_per_token()
        worth = self.geometry.state_bytes() / kv if kv > 0 else float("inf")
        share = (self._fallback_hits + 1) / (self._state_hits + 1)
        for scanned, (_, nid) in enumerate(self._by_time[ObjectKind.STATE]):
            if scanned >= FALLBACK_SCAN:
                break
            node = self._entries[nid].node
            if (self.evictable(node, ObjectKind.STATE)
                    and (node.depth - base_depth(node)) * share < worth
                    and self._is_fallback(node)):
                self._shadow_pick = node
                return True
        return False

    def _is_fallback(self, node: Node) -> bool:
        return shadowed(node, lambda n: self._may(n, ObjectKind.STATE)
                        and path_reach(n) >= n.depth)

    def _note_access(self, node: Node) -> None:
        """The deepest node of an access: a hit if its ``hits`` grows before the next call
        (the index counts a hit after ``on_access``; a save's access does not)."""
        self._settle_access()
        if not (self.scan_resistant and self.fallback_first):
            return
        if node.state is not None:
            self._last_access = (node, node.hits, self._is_fallback(node))
        self._note_branch(node)

    def _note_branch(self, node: Node) -> None:
        """Count a branch off a chain between states above ``node`` (module docstring)."""
        child, p = node, node.parent
        while p is not None and p.parent is not None and p.state is None and len(p.children) == 1:
            child, p = p, p.parent
        if (p is None or p.parent is None or p.state is not None or len(p.children) < 2
                or p.id in self._branches):
            return
        if len(self._branches) > 2 * len(self.tree) + 64:  # forget removed nodes' ids
            self._branches = {i for i in self._branches if self.tree.node(i) is not None}
        self._branches.add(p.id)
        if any(reaches_state(c) for c in p.children.values() if c is not child):
            self._state_hits += 1
            self._fallback_hits += 1

    def _settle_access(self) -> None:
        if self._last_access is not None:
            node, hits, fallback = self._last_access
            self._last_access = None
            if node.hits > hits:
                self._state_hits += 1
                self._fallback_hits += fallback

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
