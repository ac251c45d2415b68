"""The index's state table: the one owner of what an index knows of each object beside the
tree's refs (the placement of objects, pending puts, doomed objects, leases) and of the ops
left for the workers. Its methods are the only writers of those fields
(``tests/core/test_index_state_owner.py`` parses the index's modules to hold that); the
rest of the index reads them through its queries and returns what it leaves as
``Effects``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ops import Op
from hybrid_connector.tree.radix import IntegrityError, Node, ObjectRef


@dataclass(frozen=True)
class Lease:
    """Locks taken by ``acquire``; pass back to ``release`` exactly once (a second release
    raises ValueError)."""

    id: int
    kv_nodes: tuple[int, ...]
    state_node: int
    anchor_nodes: tuple[int, ...]
    keys: tuple[ObjectKey, ...] = ()


@dataclass
class Effects:
    """What a change of the index leaves for its caller to issue: ``ops`` for the workers,
    to run in this order, and ``foreign``, other models' keys the ledger dropped (to report
    outside the index's lock). Saving, reclaim, discovery and rebuild return one; the index
    (``IndexCore.issue``) queues them for ``drain`` or puts them in a save's ticket."""

    ops: list[Op] = field(default_factory=list)
    foreign: list[ObjectKey] = field(default_factory=list)

    def __iadd__(self, other: Effects) -> Effects:
        self.ops += other.ops
        self.foreign += other.foreign
        return self

    def __bool__(self) -> bool:
        return bool(self.ops or self.foreign)


class StateTable:
    """What an index knows of each object, beside the tree's refs: the node holding it
    (placement), whether its put is still in flight (pending), whether the tiers lost it
    while a lease held it (doomed), and the leases; plus the ops left for the workers and
    other models' keys to report. These methods are its only writers (a test parses the
    index's modules to hold that).

    Invariants (``check``): pending and doomed keys are placed; every lease's keys are
    counted in the leased counter, which holds nothing else. The caller holds the index's
    lock around every call; nothing here does I/O or takes another lock.
    """

    def __init__(self, max_kv_len: int = 0) -> None:
        self._where: dict[ObjectKey, int] = {}  # key -> id of the node holding its ref
        self._pending: set[ObjectKey] = set()   # indexed, put in flight: not loadable yet
        # node id -> how many pending keys it holds: ``busy`` in O(1), not one test per ref
        # (eviction asks it of every candidate it scans)
        self._busy: Counter[int] = Counter()
        self._doomed: set[ObjectKey] = set()    # lost while leased: unindexed at release
        self._leases: dict[int, Lease] = {}
        self._leased: Counter[ObjectKey] = Counter()
        self._next_lease = 1
        self._outbox: list[Op] = []
        self._foreign_drops: list[ObjectKey] = []
        self.max_kv_len = max_kv_len  # the longest KV chunk indexed so far (hit search bound)
        # keys whose residency may have changed since ``take_changes`` (None: not recorded)
        self.changes: set[ObjectKey] | None = None

    # ------------------------------------------------------------------ queries
    def node_of(self, key: ObjectKey) -> int | None:
        """Id of the node holding ``key``'s ref (None: not indexed)."""
        return self._where.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def __len__(self) -> int:
        return len(self._where)

    def placement(self) -> Mapping[ObjectKey, int]:
        """Key -> node id, read-only (a live view)."""
        return MappingProxyType(self._where)

    def is_pending(self, key: ObjectKey) -> bool:
        return key in self._pending

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def pending_keys(self) -> frozenset[ObjectKey]:
        return frozenset(self._pending)

    def busy(self, node: Node) -> bool:
        """Does ``node`` hold an object whose put is in flight? (never evicted or merged)"""
        return self._busy.get(node.id, 0) > 0

    def _pending_at(self, node_id: int | None, delta: int) -> None:
        if node_id is None:
            return
        n = self._busy[node_id] + delta
        if n:
            self._busy[node_id] = n
        else:
            del self._busy[node_id]

    def is_doomed(self, key: ObjectKey) -> bool:
        return key in self._doomed

    @property
    def has_doomed(self) -> bool:
        return bool(self._doomed)

    def unusable_sets(self) -> tuple[AbstractSet[ObjectKey], AbstractSet[ObjectKey]]:
        """(pending keys, doomed keys) as live read-only views, for a search that tests
        many keys under the index's lock (``usable`` is ``k not in either``)."""
        return self._pending, self._doomed

    def doomed_keys(self) -> frozenset[ObjectKey]:
        return frozenset(self._doomed)

    def usable(self, key: ObjectKey) -> bool:
        """Indexed or not, may it be planned? (not in flight, not doomed)"""
        return key not in self._pending and key not in self._doomed

    def is_leased(self, key: ObjectKey) -> bool:
        return self._leased.get(key, 0) > 0

    def active_leases(self) -> Mapping[int, Lease]:
        """Lease id -> lease, read-only (a live view)."""
        return MappingProxyType(self._leases)

    # ------------------------------------------------------------------ placement
    def index_ready(self, key: ObjectKey, node_id: int) -> None:
        """``key`` is indexed, loadable, at node ``node_id`` (a warm restart's or another
        instance's object, or one the tree moved; see ``moved``)."""
        self._place(key, node_id)
        if self.changes is not None:
            self.changes.add(key)
        if key.kind is ObjectKind.KV:
            self.max_kv_len = max(self.max_kv_len, key.end - key.start)

    def index_pending(self, key: ObjectKey, node_id: int) -> None:
        """``key`` was placed and is indexed at ``node_id`` with its put in flight (no
        longer doomed: this save replaces what was lost)."""
        self.index_ready(key, node_id)
        self._doomed.discard(key)
        if key not in self._pending:
            self._pending.add(key)
            self._pending_at(node_id, 1)

    def moved(self, node: Node, refs: Iterable[ObjectRef]) -> None:
        """The tree moved ``refs`` to ``node`` (a split or a merge): their placement follows."""
        for r in refs:
            self._place(r.key, node.id)

    def _place(self, key: ObjectKey, node_id: int) -> None:
        """``key``'s ref is at node ``node_id`` now; a pending key's count moves with it."""
        old = self._where.get(key)
        self._where[key] = node_id
        if old != node_id and key in self._pending:
            self._pending_at(old, -1)
            self._pending_at(node_id, 1)

    def landed(self, key: ObjectKey) -> int | None:
        """``key``'s put succeeded: loadable from now. The node holding it, when it was
        pending (None: it was not, nothing changed)."""
        if key not in self._pending:
            return None
        self._pending.discard(key)
        node_id = self._where[key]
        self._pending_at(node_id, -1)
        if self.changes is not None:
            self.changes.add(key)
        return node_id

    def doom(self, key: ObjectKey) -> None:
        """The tiers lost ``key`` while a lease holds it: never planned again, unindexed
        when the lease is released. ``key`` must be indexed."""
        if key not in self._where:
            raise KeyError(f"{key} is not indexed")
        self._doomed.add(key)
        if self.changes is not None:
            self.changes.add(key)

    def pardon(self, key: ObjectKey) -> None:
        """``key`` is no longer doomed (whether it was or not)."""
        self._doomed.discard(key)
        if self.changes is not None:
            self.changes.add(key)

    def forget(self, key: ObjectKey) -> None:
        """``key`` is no longer indexed (pending, doomed or ready). Unknown keys: no-op."""
        node_id = self._where.pop(key, None)
        if key in self._pending:
            self._pending.discard(key)
            self._pending_at(node_id, -1)
        self._doomed.discard(key)
        if self.changes is not None:
            self.changes.add(key)

    # ------------------------------------------------------------------ leases
    def open_lease(self, kv_nodes: tuple[int, ...], state_node: int,
                   anchor_nodes: tuple[int, ...], keys: tuple[ObjectKey, ...]) -> Lease:
        """Record a new lease over ``keys`` (its tree locks are the caller's)."""
        lease = Lease(self._next_lease, kv_nodes, state_node, anchor_nodes, keys)
        self._next_lease += 1
        self._leases[lease.id] = lease
        self._leased.update(keys)
        return lease

    def close_lease(self, lease: Lease) -> None:
        """Drop ``lease``'s record and its keys' counts. Raises ValueError when it was
        released already or is not this table's (nothing changes then)."""
        if self._leases.get(lease.id) != lease:
            raise ValueError(f"lease {lease.id} was already released (or is not this index's)")
        del self._leases[lease.id]
        self._leased.subtract(lease.keys)
        for key in lease.keys:
            if self._leased[key] <= 0:
                del self._leased[key]

    # ------------------------------------------------------------------ effects
    def queue(self, ops: Iterable[Op]) -> None:
        """Ops for the workers, run after those queued before (see ``take_ops``)."""
        n = len(self._outbox)
        self._outbox.extend(ops)
        if self.changes is not None:
            self.changes.update(op.key for op in self._outbox[n:])

    def touched(self, keys: Iterable[ObjectKey]) -> None:
        """The tiers' placement of ``keys`` may have changed (ops issued for them: a move
        between tiers changes nothing here but where they are read from)."""
        if self.changes is not None:
            self.changes.update(keys)

    def watch(self) -> None:
        """Start recording the keys whose residency may change (indexed, landed, doomed,
        pardoned, forgotten, or an op issued for them) for ``take_changes``: a change feed
        for an engine's KV events. Off by default (no cost)."""
        if self.changes is None:
            self.changes = set()

    def take_changes(self) -> set[ObjectKey]:
        """The keys recorded since the last call (empty when not watching)."""
        if self.changes is None:
            return set()
        got, self.changes = self.changes, set()
        return got

    def take_ops(self) -> list[Op]:
        """The ops queued since the last call, in order; the queue is left empty."""
        ops, self._outbox = self._outbox, []
        return ops

    def queue_foreign(self, keys: Iterable[ObjectKey]) -> None:
        """Keys of other models the ledger dropped (reported outside the index's lock)."""
        self._foreign_drops.extend(keys)

    def take_foreign(self) -> list[ObjectKey]:
        keys, self._foreign_drops = self._foreign_drops, []
        return keys

    # ------------------------------------------------------------------ integrity
    def check(self) -> None:
        """Raise ``IntegrityError`` unless pending and doomed keys are placed and the leased
        counter is exactly the leases' keys."""
        if not self._pending <= self._where.keys():
            raise IntegrityError("a pending key is not indexed")
        if not self._doomed <= self._where.keys():
            raise IntegrityError("a doomed key is not indexed")
        if +Counter(self._where[k] for k in self._pending) != +self._busy:
            raise IntegrityError("the pending keys counted per node do not match the placement")
        want: Counter[ObjectKey] = Counter()
        for lease in self._leases.values():
            want.update(lease.keys)
        if +want != +self._leased:
            raise IntegrityError("leased keys do not match the active leases")
