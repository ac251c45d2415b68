"""Saving into the index, in two phases so tier I/O never runs under the index's lock.

``begin``: checks each object (size against the geometry, anchor pages, range), derives
its key, skips what is present (indexed, even with its put still in flight from another
save, or covered by a stored KV chunk with the same end), makes
room for the whole batch (reclaim, then policy eviction), asks the ledger where each object
goes and indexes it as pending. It returns a ``SaveTicket``: the ops to run, in order, and
which op decides each object. ``complete``: the workers' results for some of those ops
(local ones and shared-tier ones arrive separately); a put that failed is unindexed, one
that succeeded becomes loadable. ``result`` summarises a completed ticket.

Nothing here queues ops: ``begin`` puts those it decides in the ticket, and ``complete``
and ``finish`` return theirs (``Effects``) for the index to issue. The per-key state
changes only through the index's ``StateTable``.

A save that stores nothing leaves the tree as it was; nothing raised for store failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.hashes import Hashes
from hybrid_connector.core.keys import ObjectKey, ObjectKind, PrefixHasher, as_tokens
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.manifests import encode_record, manifest_name
from hybrid_connector.index.plan import ObjectSpec, Rejection, SaveResult
from hybrid_connector.index.reclaim import Reclaimer
from hybrid_connector.index.state import IndexCore
from hybrid_connector.index.table import Effects
from hybrid_connector.policies.admission.anchors import anchor_block_bytes
from hybrid_connector.tiers.ops import Move, Op, Put, Record, Remove
from hybrid_connector.tree.radix import Node


@dataclass(frozen=True)
class SaveTicket:
    """One ``begin``'s decisions. ``keys[i]``: the key spec i is stored under (None: not
    stored by this save: rejected or already present). ``puts``: op index -> (key, whether
    it is the shared-tier copy)."""

    id: int
    ops: tuple[Op, ...]
    keys: tuple[ObjectKey | None, ...]
    present: int
    rejections: tuple[Rejection, ...]
    evicted_bytes: int
    puts: Mapping[int, tuple[ObjectKey, bool]] = field(default_factory=dict)
    leaf: tuple[int, int] = (0, 0)  # (node id, depth) the save ended at: the next one's start
    metas: Mapping[ObjectKey, ObjectMeta] = field(default_factory=dict)  # travels with puts

    def behind(self, ops: Sequence[Op]) -> SaveTicket:
        """This ticket with ``ops`` (decided before it) run first."""
        if not ops:
            return self
        n = len(ops)
        return replace(self, ops=(*ops, *self.ops),
                       puts={i + n: put for i, put in self.puts.items()})


def object_nbytes(geo: ModelGeometry, cfg: HybridConfig, kind: ObjectKind, start: int,
                  end: int) -> int:
    """Payload bytes the geometry gives an object (per TP rank): ``end - start`` tokens of
    KV, one checkpoint, or one page's anchor block."""
    if kind is ObjectKind.KV:
        return (end - start) * geo.kv_bytes_per_token()
    if kind is ObjectKind.STATE:
        return geo.state_bytes()
    density = cfg.anchor_density or 1.0 / cfg.anchor_page_size
    return anchor_block_bytes(geo, cfg.anchor_page_size, density)


class Saver:
    """The save half of a ``CacheIndex`` (shares its ``IndexCore`` state)."""

    def __init__(self, index: IndexCore, reclaim: Reclaimer) -> None:
        self.ix = index
        self.reclaim = reclaim
        self._next = 1
        self._failed: dict[int, list[Rejection]] = {}  # ticket id -> puts that failed
        self._anchor_bytes: int | None = None
        geo = index.geometry  # fixed: ``object_nbytes`` of a KV token and of a state
        self._kv_per_token, self._state_bytes = geo.kv_bytes_per_token(), geo.state_bytes()
        self._shared = index.ledger.shared_tier  # fixed by the ledger's tiers

    # ------------------------------------------------------------------ checks
    def expected_nbytes(self, kind: ObjectKind, start: int, end: int) -> int:
        """Payload bytes the geometry gives an object (per TP rank): ``end - start`` tokens
        of KV, one checkpoint, or one page's anchor block."""
        if kind is ObjectKind.KV:
            return (end - start) * self._kv_per_token
        if kind is ObjectKind.STATE:
            return self._state_bytes
        if self._anchor_bytes is None:  # fixed by the geometry and the config
            self._anchor_bytes = object_nbytes(self.ix.geometry, self.ix.config, kind, 0, 0)
        return self._anchor_bytes

    def _check(self, sp: ObjectSpec, n: int) -> str | None:
        """Why ``sp`` cannot be saved for ``n`` tokens (None: it can)."""
        kind, end = sp.kind, sp.end
        if kind is ObjectKind.KV:  # the common cases first, without ``expected_nbytes``
            if end <= n and sp.nbytes == (end - sp.start) * self._kv_per_token:
                return None
        elif kind is ObjectKind.STATE and 0 < end <= n and sp.nbytes == self._state_bytes:
            return None
        if sp.end > n or (sp.kind is ObjectKind.STATE and sp.end == 0):
            return "outside"
        page = self.ix.config.anchor_page_size
        if sp.kind is ObjectKind.ANCHOR and (sp.start % page or sp.end - sp.start != page):
            return "page"
        if sp.nbytes != self.expected_nbytes(sp.kind, sp.start, sp.end):
            return "size"
        return None

    def _covered(self, leaf: Node, key: ObjectKey) -> bool:
        """Is KV chunk ``key`` redundant: a stored chunk with its end starts at or before
        it? (One that starts later is replaced, unless a lease holds it.)"""
        if key.kind is not ObjectKind.KV:
            return False
        old = self.ix.deepest_holder(leaf, key.end).kv.get(key.end)
        table = self.ix.table
        return old is not None and (old.start <= key.start or table.is_leased(old.key)
                                    or table.is_pending(old.key))

    def _heal(self, keys: Sequence[ObjectKey]) -> Effects:
        """Unindex objects of this save that the index lists but the tiers lost without
        telling (a restarted remote), so they are stored again instead of "present"."""
        ix = self.ix
        placed, where = ix.table.placement(), ix.ledger.where
        pending, doomed = ix.table.unusable_sets()
        with ix.ledger.lock:  # one pass: indexed, usable, and no tier has it
            lost = [k for k in keys if k in placed and k not in pending and k not in doomed
                    and where(k) is None]
        out = Effects()
        for key in lost:
            out += self.reclaim.unindex(key)
        return out

    # ------------------------------------------------------------------ begin
    def begin(self, tokens: Sequence[int] | np.ndarray, specs: Sequence[ObjectSpec],
              hashes: Hashes | None = None, start: tuple[int, int] | None = None
              ) -> tuple[SaveTicket, list[ObjectKey]]:
        """Decide the save of ``specs`` made for ``tokens`` (which must cover every end).
        ``hashes``: prefix hashes of ``tokens`` the caller keeps (a request's
        ``ChainHasher``, so a save costs O(new tokens), or an engine's ``EngineHashes``);
        computed from scratch when None. ``start``: the ``leaf`` of this request's previous
        ticket, so the radix insert resumes there instead of walking the whole prefix
        (ignored when that node is gone). Returns the ticket whose ops the workers must run
        (see the module docstring) and the other models' keys the ledger dropped to make
        room (for the index to report)."""
        ix = self.ix
        arr = as_tokens(tokens)
        hasher: Hashes = hashes if hashes is not None else PrefixHasher(arr, ix.config.hash_block_size)
        order = sorted(range(len(specs)),  # StrEnum: by value
                       key=[(sp.end, sp.kind) for sp in specs].__getitem__)
        keys: list[ObjectKey | None] = [None] * len(specs)
        metas: dict[ObjectKey, ObjectMeta] = {}
        refused: list[Rejection] = []
        puts: dict[int, tuple[ObjectKey, bool]] = {}
        out = Effects()  # the ticket's ops, in order
        present = evicted = 0
        with ix.lock:
            tid, self._next = self._next, self._next + 1
            first_new = ix.tree.next_id
            top = max((sp.end for sp in specs if sp.end <= arr.size), default=0)
            leaf = ix.tree.insert_tokens(arr[:top], start=self._hint(start, top))
            ix.tree.lock_kv(leaf)  # keep the path alive while we evict for room
            try:
                fp, at, size = ix.fingerprint, hasher.at, int(arr.size)
                cand = {i: ObjectKey(fp, at(sp.end), sp.kind, sp.start, sp.end)
                        for i in order if (sp := specs[i]).end <= size}
                out += self._heal(list(cand.values()))
                batch: set[ObjectKey] = set()
                placed, doomed = ix.table.placement(), ix.table.unusable_sets()[1]
                for i in order:
                    sp = specs[i]
                    reason = self._check(sp, size)
                    if reason is not None:
                        refused.append(Rejection(sp.kind, sp.start, sp.end, reason))
                        continue
                    key = cand[i]
                    # indexed and ready, or its put is in flight (another save's, still
                    # pending): present, never placed twice
                    if ((key in placed and key not in doomed) or key in batch
                            or self._covered(leaf, key)):
                        present += 1
                        continue
                    if sp.nbytes > ix.ledger.max_object_bytes(sp.kind):
                        refused.append(Rejection(sp.kind, sp.start, sp.end, "too_large"))
                        continue
                    # objects placed before are in the ledger already: room for this one
                    ok, freed, room = self.reclaim.make_room(sp.kind, {sp.kind: sp.nbytes}, batch)
                    evicted += freed
                    out += room
                    # what a warm restart re-links it from (its tokens, its chain hashes)
                    meta = (ObjectMeta.for_range(arr, sp.start, sp.end, sp.kind, hasher)
                            if ix.backend.keeps_meta else None)
                    if ok:
                        ok = self._place(leaf, key, sp.nbytes, puts, meta, out)
                    if not ok:
                        refused.append(Rejection(sp.kind, sp.start, sp.end, "no_room"))
                        continue
                    batch.add(key)
                    keys[i] = key
                    if meta is not None:
                        metas[key] = meta
            finally:
                ix.tree.lock_kv(leaf, -1)
            for r in refused:
                ix.stats.rejected[r.kind.value] += 1
            if ix.table.changes is not None:  # moves: read from another tier now
                ix.table.touched(op.key for op in out.ops)
            survivor = self.reclaim.tidy_new(leaf, first_new)
            ix.clock += 1
            ix.eviction.on_access(ix.tree.path_to(survivor), ix.clock)
        ticket = SaveTicket(tid, tuple(out.ops), tuple(keys), present, tuple(refused), evicted,
                            puts, (survivor.id, survivor.depth), metas)
        return ticket, out.foreign

    def _hint(self, start: tuple[int, int] | None, top: int) -> Node | None:
        """The live node a request's previous ticket ended at (``SaveTicket.leaf``: node
        id, depth), where a walk over its ``top`` first tokens may resume; None when it is
        gone, merged into another node (its depth changed) or lies past ``top``."""
        hint = self.ix.tree.node(start[0]) if start else None
        if hint is None or start is None or hint.depth != start[1] or hint.depth > top:
            return None
        return hint

    def _place(self, leaf: Node, key: ObjectKey, nbytes: int,
               puts: dict[int, tuple[ObjectKey, bool]], meta: ObjectMeta | None,
               out: Effects) -> bool:
        """Ask the ledger for a tier; index the object as pending there. Its ops join
        ``out`` (the ticket's so far; ``puts`` maps the index of each put of ``key`` in
        them). A KV chunk written to the shared tier is announced there too
        (``hybrid_connector.index.manifests``)."""
        ix, shared = self.ix, self._shared
        # ``begin`` places only keys that are not indexed, or doomed: what the ledger still
        # lists of one is an orphan (a warm restart could not re-link it) or the remains of
        # a doomed one, which this save replaces
        placement = ix.ledger.place(key, nbytes, replace=True)
        for op in placement.ops:
            if isinstance(op, Put) and op.key == key:
                puts[len(out.ops)] = (key, op.tier == shared)
            out.ops.append(op)
            if (isinstance(op, Put) and op.key == key and op.tier == shared
                    and key.kind is ObjectKind.KV and shared is not None and meta is not None):
                out.ops.append(Record(key, shared, manifest_name(key.fingerprint, meta.prev),
                                      encode_record(key, nbytes, meta)))
        for k in placement.dropped:
            if ix.owns(k.fingerprint):
                out += self.reclaim.unindex(k)
            else:
                out.foreign.append(k)
        if placement.tier is None:
            return False
        out += self._index(leaf, key, nbytes)
        return True

    def _index(self, leaf: Node, key: ObjectKey, nbytes: int) -> Effects:
        """Attach a placed object, pending, to the node on ``leaf``'s path holding its end
        (the removal of a shorter chunk it replaces comes back)."""
        ix = self.ix
        node = ix.deepest_holder(leaf, key.end)
        if key.kind is ObjectKind.STATE and node.depth != key.end:
            node = ix.tree.split(node, key.end)
        old = ix.attach(node, key, nbytes, pending=True)
        # a chunk covering more replaced a shorter one with its end: that one goes
        return self.reclaim.forget([old]) if old is not None else Effects()

    # ------------------------------------------------------------------ complete
    def complete(self, ticket: SaveTicket, indices: Sequence[int],
                 results: Sequence[bool]) -> Effects:
        """The workers ran ``ticket.ops[i]`` for ``i in indices`` with these results. May be
        called once per lane; returns what it leaves (removals of failed copies)."""
        ix = self.ix
        out = Effects()
        with ix.lock:
            for i, ok in zip(indices, results, strict=True):
                op = ticket.ops[i]
                if i in ticket.puts:
                    out += self._commit(ticket, *ticket.puts[i], bool(ok))
                elif not ok and isinstance(op, Move | Put):
                    # A failed move, or a promotion's failed put back: no copy is left there.
                    tier = op.dst if isinstance(op, Move) else op.tier
                    out += self.reclaim.apply(ix.ledger.lost(op.key, tier))
                    if op.key in ix.table and ix.ledger.where(op.key) is None:
                        out += self.reclaim.unindex(op.key)
        return out

    def _commit(self, ticket: SaveTicket, key: ObjectKey, shared: bool, ok: bool) -> Effects:
        ix = self.ix
        out = Effects()
        got = ix.ledger.settle(key, ok, shared)
        if not ok and not shared and got.placed is not None:
            # Failed on some rank: the other ranks' shards of it must go too.
            out.ops.append(Remove(key, got.placed))
        nid = ix.table.landed(key) if got.usable and got.loadable else None
        if nid is not None:
            ix.stats.stored[key.kind.value] += 1
            node = ix.tree.node(nid)
            if node is not None:
                ix.eviction.on_change(node)
        elif not got.usable and key in ix.table:
            self._failed.setdefault(ticket.id, []).append(
                Rejection(key.kind, key.start, key.end, "store"))
            ix.stats.rejected[key.kind.value] += 1
            out += self.reclaim.unindex(key)
        return out

    def result(self, ticket: SaveTicket) -> SaveResult:
        """The outcome of a ticket whose ops all reported."""
        ix = self.ix
        with ix.lock:
            failed = self._failed.pop(ticket.id, [])
            stored = sum(1 for k in ticket.keys if k is not None and k in ix.table
                         and not ix.table.is_pending(k))
        refused = (*ticket.rejections, *failed)
        return SaveResult(stored, ticket.present, len(refused), ticket.evicted_bytes, refused,
                          ticket.leaf)

    # ------------------------------------------------------------------ finish
    def keeps(self, num_tokens: int, spec: ObjectSpec) -> bool:
        """False for the end-of-request checkpoint of a request of ``num_tokens`` tokens
        when admission does not keep it; True for everything else."""
        if spec.kind is not ObjectKind.STATE or spec.end != self.ix.final_checkpoint(num_tokens):
            return True
        return self.ix.admission.admit_final(num_tokens)

    def finish(self, tokens: Sequence[int] | np.ndarray, prompt_len: int | None = None,
               start: tuple[int, int] | None = None) -> Effects:
        """End of a request whose last objects were saved: release KV on its path that can
        no longer produce a hit, and tell the eviction policy about the request
        (``prompt_len``: how many of ``tokens`` were the prompt, default all). ``start``:
        the ``leaf`` of the request's last ticket, where the walk to its deepest node
        resumes (as in ``begin``; ignored when that node is gone or changed depth). An
        empty request is a no-op. Returns the removals of the KV released. Raises
        ValueError for ``prompt_len`` outside [0, len]."""
        ix = self.ix
        arr = as_tokens(tokens)
        plen = int(arr.size) if prompt_len is None else prompt_len
        if not 0 <= plen <= arr.size:
            raise ValueError(f"prompt_len {prompt_len} outside [0, {arr.size}]")
        if arr.size == 0:
            return Effects()
        with ix.lock:
            m = ix.tree.match_tokens(arr, self._hint(start, int(arr.size)))
            out = self.reclaim.prune_upward(m.node)
            if plen:
                ix.eviction.on_request(arr, plen)
        return out
