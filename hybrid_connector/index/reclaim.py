"""Reclaim: everything that takes objects out of the index. Eviction by policy to make room,
reclaiming objects the tiers hold that the index does not know, releasing KV that can no
longer produce a hit, undoing tree nodes a save created for nothing, and unindexing what the
store lost. Every deletion goes to the ledger; the ops it returns (removals of local copies)
and the other models' keys it dropped come back from each method as ``Effects``, for the
index to issue. The placement of objects changes only through the index's ``StateTable``.

All methods run under the index's lock (the ledger takes its own in each call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.index.state import IndexCore
from hybrid_connector.index.table import Effects
from hybrid_connector.tiers.ledger.ledger import Placement
from hybrid_connector.tiers.ops import Remove
from hybrid_connector.tree.coverage import serves_ancestor_state
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
                  keep: set[ObjectKey]) -> tuple[bool, int, Effects]:
        """Until the ledger fits ``pending`` (the batch so far, this item included):
        reclaim unknown objects, oldest first, then evict by policy, for ``kind`` and the
        kinds sharing its budget (in the order ``EvictionPolicy.victim_kinds`` gives). A
        victim that frees no bytes is still progress (it left the tree). Returns (fits,
        bytes freed, effects). ``keep``: keys of the batch."""
        ix = self.ix
        freed, out = 0, Effects()
        kinds: tuple[ObjectKind, ...] = ()
        while True:
            if ix.ledger.fits(pending):
                return True, freed, out
            kinds = kinds or ix.ledger.room_kinds(kind)  # asked only when room is short
            got = self._first(self.reclaim_orphan, kinds, keep, out)
            if got is None:  # the policy orders the kinds sharing the budget (pooled: by utility)
                order = ix.eviction.victim_kinds(kinds) if len(kinds) > 1 else kinds
                got = self._first(lambda k, _: self.evict_one(k), order, keep, out)
            if got is None:
                return False, freed, out
            freed += got

    @staticmethod
    def _first(take: Callable[[ObjectKind, set[ObjectKey]], tuple[int | None, Effects]],
               kinds: Sequence[ObjectKind], keep: set[ObjectKey], out: Effects) -> int | None:
        """Bytes freed by the first of ``kinds`` that ``take`` frees something of (its
        effects join ``out``); None when none does."""
        for k in kinds:
            got, effects = take(k, keep)
            out += effects
            if got is not None:
                return got
        return None

    def reclaim_orphan(self, kind: ObjectKind, keep: set[ObjectKey]) -> tuple[int | None, Effects]:
        """Forget the oldest object of ``kind`` the ledger holds for this model but the
        index does not know: its bytes (None: there is none left) and the removal."""
        ix = self.ix
        queue = self.orphans[kind]
        while queue:
            key = queue.pop(0)
            if key in ix.table or key in keep:
                continue  # indexed since (saved again) or part of this batch
            with ix.ledger.lock:  # its size and its removal, in one view
                e = ix.ledger.entries.get(key)
                if e is None:
                    continue
                ops = list(ix.ledger.remove(key))
            return e.nbytes, Effects(ops)
        return None, Effects()

    def clear(self, keys: Iterable[ObjectKey] | None = None) -> tuple[Effects, set[ObjectKey]]:
        """Forget ``keys`` (None: every object of this model, the orphans the ledger holds
        for it included), as the engine asks after its weights changed: each is unindexed
        and its local copies removed (``unindex``: a checkpoint a lease holds is doomed
        until released). A put still in flight cannot be taken back: those keys are
        returned, to be cleared once they report. Copies on the shared tier are removed
        too (other instances would find them there)."""
        ix = self.ix
        out, waiting = Effects(), set(ix.table.pending_keys())
        todo = list(ix.table.placement()) if keys is None else list(keys)
        if keys is None:
            for queue in self.orphans.values():
                todo += queue
                queue.clear()
        shared = ix.ledger.shared_tier
        for key in todo:
            if key in waiting:
                continue
            with ix.ledger.lock:
                e = ix.ledger.entries.get(key)
            if shared is not None and e is not None and e.shared:
                out.ops.append(Remove(key, shared))
            out += self.unindex(key) if key in ix.table else Effects(list(ix.ledger.remove(key)))
        return out, waiting & set(todo)

    # ------------------------------------------------------------------ eviction
    def evictable(self, node: Node, kind: ObjectKind) -> bool:
        """May ``kind`` be taken from ``node`` now? (the policies call this)"""
        ix = self.ix
        if node is ix.tree.root or ix.table.busy(node):
            return False
        if kind is ObjectKind.KV:
            return ix.tree.can_remove(node)
        if kind is ObjectKind.STATE:
            return node.state is not None and not node.state_lock
        # An anchor lock is node local, and a split moves the pages ending above the cut to
        # a new, unlocked node: the pages a lease holds are asked of the table by key.
        # (A checkpoint never leaves its node; a KV lock counts on every ancestor.)
        return (bool(node.anchors) and not node.anchor_lock
                and not any(ix.table.is_leased(r.key) for r in node.anchors.values()))

    def evict_one(self, kind: ObjectKind) -> tuple[int | None, Effects]:
        """Evict one victim's objects of ``kind`` (a KV victim takes its whole leaf):
        the bytes freed over all kinds (None: no victim) and the removals."""
        ix = self.ix
        node = ix.eviction.next_victim(kind)
        if node is None or not self.evictable(node, kind):
            return None, Effects()
        before = {k: ix.tree.bytes[k] for k in ObjectKind}
        if kind is ObjectKind.KV:
            parent = node.parent
            out = self.forget(self.remove_leaf(node))
            if parent is not None:
                out += self.prune_upward(parent)
        elif kind is ObjectKind.STATE:
            ref = ix.tree.drop_state(node)
            out = self.forget([ref] if ref else [])
            out += self.after_state_loss(node)
        else:
            refs = list(node.anchors.values())
            for r in refs:
                ix.tree.drop_ref(node, r)
            out = self.forget(refs)
            out += self.prune_upward(node)
        freed = 0
        for k, b in before.items():
            got = max(0, b - ix.tree.bytes[k])
            ix.stats.evicted[k.value] += got
            freed += got
        return freed, out

    def remove_leaf(self, node: Node) -> list[ObjectRef]:
        nid = node.id
        refs = self.ix.tree.remove_leaf(node)
        self.ix.eviction.on_remove(nid)
        return refs

    def forget(self, refs: Sequence[ObjectRef]) -> Effects:
        """Unindex refs the tree already let go of; the removals of their bytes."""
        ix = self.ix
        out = Effects()
        for r in refs:
            ix.table.forget(r.key)
            out.ops += ix.ledger.remove(r.key)
        return out

    # ------------------------------------------------------------------ structure
    def after_state_loss(self, node: Node) -> Effects:
        """A node lost its state: release it if dead, fold it if it is a pass-through, and
        release child leaves that were kept only to serve that state."""
        ix = self.ix
        if node.is_leaf:
            return self.prune_upward(node)
        out = Effects()
        for child in list(node.children.values()):
            if child.is_leaf:
                out += self.prune_upward(child)  # may release ``node`` too, walking up
        if ix.tree.node(node.id) is not node or node.is_leaf:
            return out
        if ix.tree.can_merge(node) and not ix.table.busy(node):
            nid = node.id
            child = ix.tree.merge_into_child(node)
            ix.eviction.on_remove(nid)
            ix.eviction.on_change(child)
        return out

    def prune_upward(self, node: Node) -> Effects:
        """Release leaves whose KV can no longer produce a hit (no state, no usable
        anchors, unlocked, nothing in flight), walking up while that holds."""
        ix = self.ix
        out = Effects()
        if not ix.needs_state:
            return out
        cur: Node | None = node
        while (cur is not None and ix.tree.can_remove(cur) and not ix.table.busy(cur)
               and cur.state is None and not (ix.config.replay and cur.anchors)
               and not serves_ancestor_state(cur)):
            parent = cur.parent
            out += self.forget(self.remove_leaf(cur))
            cur = parent
        return out

    def tidy_new(self, leaf: Node, first_new: int) -> Node:
        """Undo what ``insert`` created for a save but nothing uses: object-less leaves
        made by this save go, and a node this save split off folds back into its child.
        Returns the deepest surviving node of the path: when the split-off node folded,
        its parent. (Its child lies past the path's end, on the other request's tokens: a
        walk resumed there, ``begin_save(start=ticket.leaf)``, would hang this request's
        objects on that request's path.)"""
        ix = self.ix
        cur = leaf
        while (cur.id >= first_new and ix.tree.can_remove(cur) and not cur.kv
               and not cur.anchors and cur.state is None):
            parent = cur.parent
            self.remove_leaf(cur)
            assert parent is not None
            cur = parent
        if cur.id >= first_new and ix.tree.can_merge(cur) and not ix.table.busy(cur):
            nid, parent = cur.id, cur.parent
            child = ix.tree.merge_into_child(cur)
            ix.eviction.on_remove(nid)
            ix.eviction.on_change(child)
            assert parent is not None
            cur = parent
        return cur

    def apply(self, placement: Placement) -> Effects:
        """Forget what a placement of the ledger dropped: its ops, then the removals
        that leaves, and the other models' drops (delivered later, outside our lock)."""
        ix = self.ix
        out = Effects(list(placement.ops))
        for key in placement.dropped:
            if ix.owns(key.fingerprint):
                out += self.unindex(key)
            else:
                out.foreign.append(key)
        return out

    # ------------------------------------------------------------------ losses
    def unindex(self, key: ObjectKey) -> Effects:
        """Forget one object the tiers lost or failed to read, and whatever the ledger
        still lists of it (its remaining local copy is deleted). A checkpoint under a lease
        stays indexed, doomed (never planned again), until the lease is released."""
        ix = self.ix
        nid = ix.table.node_of(key)
        node = ix.tree.node(nid) if nid is not None else None
        if node is None:
            ix.table.forget(key)
            return Effects()
        if key.kind is ObjectKind.STATE and node.state_lock:
            ix.table.doom(key)
            return Effects()
        for ref in (node.state, node.kv.get(key.end), node.anchors.get(key.end)):
            if ref is None or ref.key != key:
                continue
            ix.tree.drop_ref(node, ref)
            ix.table.forget(key)
            out = Effects(list(ix.ledger.remove(key)))
            ix.eviction.on_change(node)
            if key.kind is ObjectKind.STATE:
                out += self.after_state_loss(node)
            elif not node.kv and not node.anchors and node.state is None:
                if ix.needs_state:
                    out += self.prune_upward(node)
                else:
                    self._drop_empty(node)
            return out
        ix.table.pardon(key)  # indexed, yet not on its node (no ref to drop): not doomed
        return Effects()

    def _drop_empty(self, node: Node) -> None:
        """Without recurrent layers nothing prunes: remove object-less leaves upward."""
        ix = self.ix
        cur: Node | None = node
        while (cur is not None and ix.tree.can_remove(cur) and not ix.table.busy(cur)
               and not cur.kv and not cur.anchors and cur.state is None):
            parent = cur.parent
            self.remove_leaf(cur)
            cur = parent
