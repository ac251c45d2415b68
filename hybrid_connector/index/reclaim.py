"""Reclaim: everything that takes objects out of the index. Eviction by policy to make room,
reclaiming objects the tiers hold that the index does not know, releasing KV that can no
longer produce a hit, undoing tree nodes a save created for nothing, and unindexing what the
store lost. Every deletion goes to the ledger, and the ops it returns (removals of local
copies) go to ``index.outbox`` for the caller to run.

All methods run under the index's lock (and take the backend's lock for the ledger).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.index.state import IndexCore
from hybrid_connector.tiers.ledger import Placement
from hybrid_connector.tree.radix import Node, ObjectRef


class Reclaimer:
    """The reclaim half of a ``CacheIndex`` (shares its ``IndexCore`` state)."""

    def __init__(self, index: IndexCore) -> None:
        self.ix = index
        # What the tiers hold for this model that this (new) index does not know (a
        # previous run's objects, when not re-indexed), oldest first.
        self.orphans: dict[ObjectKind, list[ObjectKey]] = {k: [] for k in ObjectKind}

    # ------------------------------------------------------------------ room
    def make_room(self, kind: ObjectKind, pending: Mapping[ObjectKind, int],
                  keep: set[ObjectKey]) -> tuple[bool, int]:
        """Until the ledger fits ``pending`` (the batch so far, this item included):
        reclaim unknown objects, oldest first, then evict by policy, for ``kind`` and the
        kinds sharing its budget (in the order ``EvictionPolicy.victim_kinds`` gives). A
        victim that frees no bytes is still progress (it left the tree). Returns (fits,
        bytes freed). ``keep``: keys of the batch."""
        ix = self.ix
        freed = 0
        with ix.backend.lock:
            kinds = ix.ledger.room_kinds(kind)
        while True:
            with ix.backend.lock:
                if ix.ledger.fits(pending):
                    return True, freed
            got = next((g for k in kinds if (g := self.reclaim_orphan(k, keep)) is not None), None)
            if got is None:  # the policy orders the kinds sharing the budget (pooled: by utility)
                order = ix.eviction.victim_kinds(kinds) if len(kinds) > 1 else kinds
                got = next((g for k in order if (g := self.evict_one(k)) is not None), None)
            if got is None:
                return False, freed
            freed += got

    def reclaim_orphan(self, kind: ObjectKind, keep: set[ObjectKey]) -> int | None:
        """Forget the oldest object of ``kind`` the ledger holds for this model but the
        index does not know; its bytes (None: there is none left)."""
        ix = self.ix
        queue = self.orphans[kind]
        while queue:
            key = queue.pop(0)
            if key in ix.where or key in keep:
                continue  # indexed since (saved again) or part of this batch
            with ix.backend.lock:
                e = ix.ledger.entries.get(key)
                if e is None:
                    continue
                ix.outbox.extend(ix.ledger.remove(key))
            return e.nbytes
        return None

    # ------------------------------------------------------------------ eviction
    def evictable(self, node: Node, kind: ObjectKind) -> bool:
        """May ``kind`` be taken from ``node`` now? (the policies call this)"""
        ix = self.ix
        if node is ix.tree.root or ix.busy(node):
            return False
        if kind is ObjectKind.KV:
            return ix.tree.can_remove(node)
        if kind is ObjectKind.STATE:
            return node.state is not None and not node.state_lock
        return bool(node.anchors) and not node.anchor_lock

    def evict_one(self, kind: ObjectKind) -> int | None:
        """Evict one victim's objects of ``kind`` (a KV victim takes its whole leaf);
        return the bytes freed over all kinds (None: no victim)."""
        ix = self.ix
        node = ix.eviction.next_victim(kind)
        if node is None or not self.evictable(node, kind):
            return None
        before = {k: ix.tree.bytes[k] for k in ObjectKind}
        if kind is ObjectKind.KV:
            parent = node.parent
            self.forget(self.remove_leaf(node))
            if parent is not None:
                self.prune_upward(parent)
        elif kind is ObjectKind.STATE:
            ref = ix.tree.drop_state(node)
            self.forget([ref] if ref else [])
            self.after_state_loss(node)
        else:
            refs = list(node.anchors.values())
            for r in refs:
                ix.tree.drop_ref(node, r)
            self.forget(refs)
            self.prune_upward(node)
        freed = 0
        for k, b in before.items():
            got = max(0, b - ix.tree.bytes[k])
            ix.stats.evicted[k.value] += got
            freed += got
        return freed

    def remove_leaf(self, node: Node) -> list[ObjectRef]:
        nid = node.id
        refs = self.ix.tree.remove_leaf(node)
        self.ix.eviction.on_remove(nid)
        return refs

    def forget(self, refs: Sequence[ObjectRef]) -> None:
        """Unindex refs the tree already let go of, and delete their bytes."""
        ix = self.ix
        with ix.backend.lock:
            for r in refs:
                ix.where.pop(r.key, None)
                ix.doomed.discard(r.key)
                ix.outbox.extend(ix.ledger.remove(r.key))

    # ------------------------------------------------------------------ structure
    def after_state_loss(self, node: Node) -> None:
        """A node lost its state: release it if dead, fold it if it is a pass-through, and
        release child leaves that were kept only to serve that state."""
        ix = self.ix
        if node.is_leaf:
            self.prune_upward(node)
            return
        for child in list(node.children.values()):
            if child.is_leaf:
                self.prune_upward(child)  # may release ``node`` too, walking up
        if ix.tree.node(node.id) is not node or node.is_leaf:
            return
        if ix.tree.can_merge(node) and not ix.busy(node):
            nid = node.id
            child = ix.tree.merge_into_child(node)
            ix.eviction.on_remove(nid)
            ix.eviction.on_change(child)

    def prune_upward(self, node: Node) -> None:
        """Release leaves whose KV can no longer produce a hit (no state, no usable
        anchors, unlocked, nothing in flight), walking up while that holds."""
        ix = self.ix
        if not ix.needs_state:
            return
        cur: Node | None = node
        while (cur is not None and ix.tree.can_remove(cur) and not ix.busy(cur)
               and cur.state is None and not (ix.config.replay and cur.anchors)
               and not serves_ancestor_state(cur)):
            parent = cur.parent
            self.forget(self.remove_leaf(cur))
            cur = parent

    def tidy_new(self, leaf: Node, first_new: int) -> Node:
        """Undo what ``insert`` created for a save but nothing uses: object-less leaves
        made by this save go, and a node this save split off folds back into its child.
        Returns the deepest surviving node of the path."""
        ix = self.ix
        cur = leaf
        while (cur.id >= first_new and ix.tree.can_remove(cur) and not cur.kv
               and not cur.anchors and cur.state is None):
            parent = cur.parent
            self.remove_leaf(cur)
            assert parent is not None
            cur = parent
        if cur.id >= first_new and ix.tree.can_merge(cur) and not ix.busy(cur):
            nid = cur.id
            cur = ix.tree.merge_into_child(cur)
            ix.eviction.on_remove(nid)
            ix.eviction.on_change(cur)
        return cur

    def apply(self, placement: Placement) -> None:
        """Queue a placement's ops and forget what it dropped (backend lock held); other
        models' drops are delivered later, outside our lock."""
        ix = self.ix
        ix.outbox.extend(placement.ops)
        for key in placement.dropped:
            if key.fingerprint == ix.fingerprint:
                self.unindex(key)
            else:
                ix.foreign_drops.append(key)

    # ------------------------------------------------------------------ losses
    def unindex(self, key: ObjectKey) -> None:
        """Forget one object the tiers lost or failed to read, and whatever the ledger
        still lists of it (its remaining local copy is deleted). A checkpoint under a lease
        stays indexed, doomed (never planned again), until the lease is released."""
        ix = self.ix
        nid = ix.where.get(key)
        node = ix.tree.node(nid) if nid is not None else None
        if node is None:
            ix.where.pop(key, None)
            ix.doomed.discard(key)
            return
        if key.kind is ObjectKind.STATE and node.state_lock:
            ix.doomed.add(key)
            return
        ix.doomed.discard(key)
        for ref in (node.state, node.kv.get(key.end), node.anchors.get(key.end)):
            if ref is None or ref.key != key:
                continue
            ix.tree.drop_ref(node, ref)
            del ix.where[key]
            ix.pending.discard(key)
            with ix.backend.lock:
                ix.outbox.extend(ix.ledger.remove(key))
            ix.eviction.on_change(node)
            if key.kind is ObjectKind.STATE:
                self.after_state_loss(node)
            elif not node.kv and not node.anchors and node.state is None:
                self.prune_upward(node) if ix.needs_state else self._drop_empty(node)
            return

    def _drop_empty(self, node: Node) -> None:
        """Without recurrent layers nothing prunes: remove object-less leaves upward."""
        ix = self.ix
        cur: Node | None = node
        while (cur is not None and ix.tree.can_remove(cur) and not ix.busy(cur)
               and not cur.kv and not cur.anchors and cur.state is None):
            parent = cur.parent
            self.remove_leaf(cur)
            cur = parent


def serves_ancestor_state(node: Node) -> bool:
    """Does a KV chunk on ``node`` start before its edge and reach across an ancestor's
    checkpoint? (A chunk saved past a checkpoint, e.g. a request's tail chunk past its
    aligned final checkpoint, is the only KV for the tokens just before that checkpoint:
    releasing it would strand the state.)"""
    starts = [r.start for r in node.kv.values() if r.start < node.start]
    if not starts:
        return False
    lo = min(starts)
    anc = node.parent
    while anc is not None and anc.depth > lo:
        if anc.state is not None:
            return True
        anc = anc.parent
    return False
