"""``CacheIndex``: what is known. The radix index, the hit rule, the policies and the
ledger of what is where; never a byte. It runs in an engine's scheduler process, in the
cache server, or embedded (``HybridCache``); the bytes live in the tiers of the processes
that hold them, which run the ops this index emits and report back.

Life of a request against the index::

    plan = index.lookup(prompt)              # pure: LoadPlan (keys, tiers, p, exact)
    lease = index.acquire(plan)              # lock + pin what will be loaded
    ... workers read the plan's keys ...     # failures: index.report_load(plan, failed)
    ticket = index.begin_save(prompt, specs) # keys, room, placement; objects pending
    ... workers run ticket.ops ...           # index.complete_save(ticket, results)
    index.release(lease)
    index.finish(tokens, specs, prompt_len)  # final checkpoint (admission), dead KV

Every mutating call may leave ops in ``drain()`` (removals of evicted objects, promotions)
for the caller to run on the workers, in order. Objects in flight count against budgets,
are never evicted and never planned (``LoadPlan.pending_tokens`` tells how far a hit would
reach once they land). Store failures never corrupt the index: an object the tiers lose is
unindexed (a leased checkpoint when its lease is released), and the index heals when the
engine saves it again.

Thread safety: one re-entrant lock per index; the ledger takes its own inside it. The
per-key bookkeeping (placement, pending puts, doomed objects, leases, ops left for the
workers) changes only through the ``StateTable``'s methods (``IndexCore.table``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.hashes import Hashes
from hybrid_connector.core.keys import ObjectKey, PrefixHasher, as_tokens, epoch_fingerprint
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.discovery import Found, SharedView, discover
from hybrid_connector.index.hit import Hit, Usable, UsableNow, find_hit, kv_chain
from hybrid_connector.index.integrity import check_index
from hybrid_connector.index.plan import SLOW_TIERS, LoadPlan, ObjectSpec, PlannedObject
from hybrid_connector.index.rebuild import Rebuilt, adopt_reported, relink
from hybrid_connector.index.reclaim import Reclaimer
from hybrid_connector.index.saving import Saver, SaveTicket
from hybrid_connector.index.state import IndexCore, Lease, Policies
from hybrid_connector.policies.admission.checkpoints import branch_point
from hybrid_connector.policies.base import SavePlan
from hybrid_connector.policies.eviction.tier_value import TierValue
from hybrid_connector.tiers.backend import Backend
from hybrid_connector.tiers.store import StoreHooks
from hybrid_connector.tree.radix import MatchResult, Node, ObjectRef


class CacheIndex(IndexCore):
    """Index of one model fingerprint over one ``Backend`` (see the module docstring).

    ``model_id`` names the weights (e.g. ``org/model@revision``) and ``layout`` holds engine
    facts that change stored bytes (block size, KV layout, TP layout); both enter the
    fingerprint with the geometry, so objects of other weights, geometry, dtype or layout
    can never be loaded. Raises ValueError when another index of the same fingerprint is
    attached to ``backend``.
    """

    def __init__(self, config: HybridConfig, geometry: ModelGeometry, backend: Backend,
                 policies: Policies, layout: dict[str, object] | None = None,
                 model_id: str = "") -> None:
        super().__init__(config, geometry, backend, policies, layout, model_id)
        self.reclaim = Reclaimer(self)
        self.saver = Saver(self, self.reclaim)
        self.shared_view: SharedView | None = None  # the shared tier, for ``discover``
        self._slow_tiers = {s.name for s in self.ledger.specs if s.slow} | SLOW_TIERS  # fixed
        self.eviction.bind(self.tree, geometry, self.reclaim.evictable)
        # tier_eviction: value scores tier victims and destinations (the backend's setting)
        valued = config.tier_eviction == "value"
        self.tier_value = TierValue.from_config(geometry, config) if valued else None
        self._hooks = StoreHooks(self._on_store_drop, self._merits_demotion,
                                 self._anchors_of_chunk, self.tier_value)
        backend.attach(self.fingerprint, self._hooks)
        with self.ledger.lock:
            if valued:
                self.ledger.value_window = config.tier_value_window
            for key in self.ledger.held():
                if key.fingerprint == self.fingerprint:
                    self.reclaim.orphans[key.kind].append(key)

    # ---------------------------------------------------------------- lookup
    def lookup(self, tokens: Sequence[int] | np.ndarray, alignment: int | None = None,
               replay: bool | None = None, floor: int = 0) -> LoadPlan:
        """The longest usable hit for ``tokens`` under the hit rule. No side effects.

        ``alignment`` (default ``config.alignment``) restricts hit lengths to its multiples.
        ``replay`` (default ``config.replay``) allows approximate anchor-replay plans; pass
        False for the best exact plan, e.g. when a quality gate refused a replay. ``floor``: a
        hit the caller has; a match not past it is a miss at once (no hit can pass it).
        Raises ValueError for non-integer or negative tokens and a non-positive alignment."""
        arr = as_tokens(tokens)
        align = self._alignment(alignment)
        use_replay = self.config.replay if replay is None else replay
        with self.lock:
            m = self.tree.match_tokens(arr)
            if m.length <= floor:  # every hit, exact or replayed, lies within the match
                return LoadPlan(0, True, matched_tokens=m.length, prompt_tokens=int(arr.size))
            usable = UsableNow(*self.table.unusable_sets())
            hit = self._find(m, arr.size, align, use_replay, usable)
            pending = 0
            if usable.met_pending:  # else the search counting them would retrace this one
                later = self._find(m, arr.size, align, use_replay, usable.once_landed)
                pending = later.p if later.p > hit.p else 0
            if not hit.p or hit.node is None:
                return LoadPlan(0, True, kv_tokens=hit.kv_reach, matched_tokens=m.length,
                                prompt_tokens=int(arr.size), pending_tokens=pending)
            return self._plan(arr, hit.kv, hit.p, hit.state, hit.anchors, hit.kv_reach,
                              m.length, hit.node, align, pending)

    def _find(self, m: MatchResult, n: int, align: int, replay: bool, usable: Usable) -> Hit:
        c = self.config
        return find_hit(m, int(n), align, needs_state=self.needs_state, max_kv_len=self.max_kv_len,
                        usable=usable, replay=replay, page=c.anchor_page_size,
                        budget_frac=c.replay_budget_frac, max_tokens=c.replay_max_tokens,
                        root=self.tree.root, needs_kv=self.needs_kv)

    def lookup_at(self, tokens: Sequence[int] | np.ndarray, p: int,
                  alignment: int | None = None) -> LoadPlan:
        """A plan for a hit of exactly ``p`` tokens (exact state at p, KV over ``[0, p)``),
        or a miss (also when ``p`` is not below the prompt length). For engines whose own
        cache already holds the attention KV up to p and only need the recurrent state there
        (vLLM's divergent local hybrid hits). Pure. Raises ValueError when ``p`` is negative
        or not a multiple of the alignment (default ``config.alignment``)."""
        arr = as_tokens(tokens)
        align = self._alignment(alignment)
        if isinstance(p, bool) or not isinstance(p, int | np.integer) or p < 0 or p % align:
            raise ValueError(f"lookup_at: p={p!r} must be a non-negative multiple of the "
                             f"alignment {align}")
        with self.lock:
            m = self.tree.match_tokens(arr)
            miss = LoadPlan(0, True, matched_tokens=m.length, prompt_tokens=int(arr.size))
            if not 0 < p < arr.size or p > m.length:
                return miss
            chain, reach = kv_chain(m, self.max_kv_len, self.table.usable, needs_kv=self.needs_kv)
            node = next((n for n in m.path if n.depth == p), None)
            usable_state = node is not None and node.state is not None and self.table.usable(node.state.key)
            if reach < p or (self.needs_state and not usable_state):
                return miss
            target = node if node is not None else self.tree.root
            return self._plan(arr, [r for r in chain if r.start < p], int(p), target.state,
                              (), reach, m.length, target, align, 0)

    def _plan(self, arr: np.ndarray, kv: Sequence[ObjectRef], p: int, state: ObjectRef | None,
              anchors: Sequence[ObjectRef], reach: int, matched: int, node: Node, align: int,
              pending: int) -> LoadPlan:
        refs = [*kv, *([state] if state else []), *anchors]
        with self.ledger.lock:  # one view of the tiers for the whole plan
            tiers = [self.ledger.where(r.key) for r in refs]
        if any(t is None for t in tiers):
            # The index lags the tiers (a silent loss): never promise what cannot be read.
            return LoadPlan(0, True, kv_tokens=reach, matched_tokens=matched,
                            prompt_tokens=int(arr.size), pending_tokens=pending)
        planned = [PlannedObject(r, t) for r, t in zip(refs, tiers, strict=True) if t]
        slow = self._slow_tiers
        n_kv = len(kv)
        return LoadPlan(
            num_tokens=p,
            exact=state is not None or not self.needs_state,
            kv=tuple(planned[:n_kv]),
            state=planned[n_kv] if state else None,
            anchors=tuple(planned[n_kv + (1 if state else 0):]),
            replay_from=anchors[0].start if anchors else p,
            kv_tokens=reach, matched_tokens=matched, prompt_tokens=int(arr.size),
            node_id=node.id, is_async=any(o.tier in slow for o in planned), alignment=align,
            pending_tokens=pending,
        )

    def record_lookup(self, plan: LoadPlan) -> None:
        """Count a lookup in the statistics (separate so ``lookup`` stays pure)."""
        with self.lock:
            self.stats.lookups += 1
            self.stats.prompt_tokens += plan.prompt_tokens
            if plan.hit:
                self.stats.hits += 1
                self.stats.hit_tokens += plan.num_tokens
                self.stats.approx_hits += not plan.exact

    def plan_saves(self, tokens: Sequence[int] | np.ndarray,
                   alignment: int | None = None) -> SavePlan:
        """Where admission wants checkpoints while ``tokens`` (a prompt) is prefilled, by
        speculative insertion. No side effects. Raises ValueError for a bad alignment."""
        arr = as_tokens(tokens)
        with self.lock:
            m, positions = self._admitted(arr, self._alignment(alignment))
            doomed = self.table.unusable_sets()[1]
            _, reach = kv_chain(m, self.max_kv_len, (lambda k: k not in doomed) if doomed else None,
                                needs_kv=self.needs_kv)
            kv_from = reach - reach % self.config.chunk_size
            return SavePlan(tuple(sorted(set(positions))), branch_point(m, int(arr.size)), kv_from)

    def state_positions(self, tokens: Sequence[int] | np.ndarray,
                        alignment: int | None = None) -> set[int]:
        """``set(plan_saves(tokens, alignment).state_positions)`` without the rest of the
        plan (its KV reach and branch point). Admission is asked exactly as ``plan_saves``
        asks it (it may learn from the query). Raises ValueError for a bad alignment."""
        arr = as_tokens(tokens)
        with self.lock:
            return set(self._admitted(arr, self._alignment(alignment))[1])

    def _admitted(self, arr: np.ndarray, align: int) -> tuple[MatchResult, Sequence[int]]:
        """The match of ``arr`` and admission's state positions over it; under the lock."""
        m = self.tree.match_tokens(arr)
        return m, self.admission.state_positions(self.tree, m, arr, align)

    # ---------------------------------------------------------------- leases
    def acquire(self, plan: LoadPlan) -> Lease | None:
        """Lock the plan's objects against eviction, pin them against moves, and count it
        as an access. ``None`` (nothing locked) when the plan went stale (a node or object
        left since ``lookup``): look up again."""
        if not plan.hit:
            return None
        with self.lock:
            node = self.tree.node(plan.node_id)
            table = self.table
            if node is None or any(o.ref.key not in table or not table.usable(o.ref.key)
                                   for o in plan.objects):
                return None
            kv_nodes = tuple(sorted({self.deepest_holder(node, plan.num_tokens).id}
                                    | {table.node_of(o.ref.key) or 0 for o in plan.kv}))
            for nid in kv_nodes:
                self.tree.lock_kv(self._node(nid))
            state_node = 0
            if plan.state is not None:
                self.tree.lock_state(node)
                state_node = node.id
            anchor_nodes = tuple(sorted({table.node_of(o.ref.key) or 0 for o in plan.anchors}))
            for nid in anchor_nodes:
                self.tree.lock_anchors(self._node(nid))
            keys = tuple(o.ref.key for o in plan.objects)
            self.ledger.pin(keys)
            self.ledger.touch(keys)
            self.clock += 1
            self.eviction.on_access(self.tree.path_to(node), self.clock)
            node.hits += 1
            return table.open_lease(kv_nodes, state_node, anchor_nodes, keys)

    def release(self, lease: Lease | None, promote: bool = True) -> None:
        """Drop the locks of ``acquire`` (safe with ``None``), unindex what was lost while
        leased, and (``promote``) move objects read from slower tiers up (ops in
        ``drain``). Raises ValueError for a lease already released or not this index's."""
        if lease is None:
            return
        with self.lock:
            table = self.table
            table.close_lease(lease)  # ValueError for a lease released already
            for nid in lease.kv_nodes:
                self.tree.lock_kv(self._node(nid), -1)
            if lease.state_node:
                self.tree.lock_state(self._node(lease.state_node), -1)
            for nid in lease.anchor_nodes:
                self.tree.lock_anchors(self._node(nid), -1)
            self.ledger.pin(lease.keys, -1)
            if promote:
                for key in lease.keys:
                    if key in table and not table.is_leased(key):
                        self.issue(self.reclaim.apply(self.ledger.promote(key)))
            for key in [k for k in lease.keys if table.is_doomed(k)]:
                self.issue(self.reclaim.unindex(key))

    # ---------------------------------------------------------------- loads
    def report_load(self, plan: LoadPlan, failed: Sequence[ObjectKey]) -> None:
        """Workers could not read ``failed`` (missing, corrupt, short): forget the bad
        copies; an object with no copy left is unindexed (a leased checkpoint at release),
        so the engine's next save stores it again."""
        if not failed:
            return
        tiers = {o.ref.key: o.tier for o in plan.objects}
        with self.lock:
            self.stats.load_failures += 1
            for key in failed:
                self.issue(self.reclaim.apply(self.ledger.lost(key, tiers.get(key))))
            for key in failed:
                if (key in self.table and self.ledger.where(key) is None
                        and not self.table.is_pending(key)):
                    self.issue(self.reclaim.unindex(key))

    # ---------------------------------------------------------------- saves
    def begin_save(self, tokens: Sequence[int] | np.ndarray, specs: Sequence[ObjectSpec],
                   hashes: Hashes | None = None, start: tuple[int, int] | None = None) -> SaveTicket:
        """See ``Saver.begin``. Ops left by earlier calls and not drained yet run first (they
        were decided first)."""
        with self.lock:
            ticket, foreign = self.saver.begin(tokens, specs, hashes, start)
            ticket = ticket.behind(self.table.take_ops())
            if foreign:
                self.table.queue_foreign(foreign)
        self.deliver_foreign_drops()
        return ticket

    def complete_save(self, ticket: SaveTicket, indices: Sequence[int],
                      results: Sequence[bool]) -> None:
        """See ``Saver.complete``; the ops it leaves go to ``drain``."""
        with self.lock:
            out = self.saver.complete(ticket, indices, results)
            if out:
                self.issue(out)
        self.deliver_foreign_drops()

    def finish(self, tokens: Sequence[int] | np.ndarray, prompt_len: int | None = None,
               start: tuple[int, int] | None = None) -> None:
        """See ``Saver.finish``; the ops it leaves go to ``drain``."""
        with self.lock:
            self.issue(self.saver.finish(tokens, prompt_len, start))

    # ---------------------------------------------------------------- sharing
    def discover(self, tokens: Sequence[int] | np.ndarray, hashes: Hashes | None = None,
                 deadline_s: float | None = None, alignment: int | None = None) -> Found:
        """Index what other instances stored on the shared tier for ``tokens`` (see
        ``hybrid_connector.index.discovery``; no shared tier: nothing). ``hashes``: the prompt's
        prefix hashes (computed when None); ``deadline_s`` defaults to the config's
        ``lookup_timeout_ms``. Never raises for the tier's failures."""
        if self.shared_view is None:
            return Found()
        arr = as_tokens(tokens)
        hasher = hashes if hashes is not None else PrefixHasher(arr, self.config.hash_block_size)
        limit = self.config.lookup_timeout_ms / 1e3 if deadline_s is None else deadline_s
        found, out = discover(self, self.reclaim, self.shared_view, arr, hasher, limit,
                              self._alignment(alignment))
        with self.lock:
            self.issue(out)
        self.deliver_foreign_drops()
        return found

    # ---------------------------------------------------------------- restart
    def rebuild(self, items: Iterable[tuple[ObjectKey, int, ObjectMeta | None]],
                verify: bool = True) -> Rebuilt:
        """Re-link objects the tiers hold (``(key, nbytes, meta)``, e.g. every tier's
        ``inventory()``; in a scheduler process, what the workers report) into the index:
        see ``hybrid_connector.index.rebuild``. What does not link stays an orphan (reclaimed
        first). ``verify``: check the chains against this project's own blake3 keys."""
        return relink(self, items, verify)

    def adopt(self, items: Iterable[tuple[ObjectKey, int, ObjectMeta | None, str]],
              verify: bool = True, strays: Iterable[tuple[ObjectKey, str]] = ()) -> Rebuilt:
        """Adopt and re-link what worker processes report they hold (``(key, nbytes, meta,
        tier)``), remove ``strays``; see ``hybrid_connector.index.rebuild.adopt_reported``."""
        rebuilt, out = adopt_reported(self, items, self.reclaim.orphans, verify, strays)
        with self.lock:
            self.issue(out)
        return rebuilt

    def clear(self, keys: Iterable[ObjectKey] | None = None, new_epoch: bool = False
              ) -> set[ObjectKey]:
        """Forget ``keys``, None: everything of this model (``Reclaimer.clear``); returns
        the keys whose puts are still in flight (clear them again once they report).
        ``new_epoch``: the weights changed in memory, so what is saved from now on is keyed
        under a fingerprint of its own (``keys.epoch_fingerprint``), which a restarted engine
        (loading the files) never adopts and engines of the old weights never discover."""
        with self.lock:
            out, waiting = self.reclaim.clear(keys)
            self.issue(out)
            if new_epoch:
                self.retired.add(self.fingerprint)
                self.fingerprint = epoch_fingerprint(self.fingerprint)
                self.backend.attach(self.fingerprint, self._hooks)
        return waiting

    # ---------------------------------------------------------------- callbacks
    def _on_store_drop(self, keys: Sequence[ObjectKey]) -> None:
        """The backend dropped objects on its own: forget them so no plan promises them."""
        with self.lock:
            for key in keys:
                self.issue(self.reclaim.unindex(key))

    def _anchors_of_chunk(self, key: ObjectKey) -> list[ObjectKey]:
        """Anchor pages ending inside KV chunk ``key`` (they die with it). Lock free."""
        nid = self.table.node_of(key)
        node = self.tree.node(nid) if nid is not None else None
        if node is None:
            return []
        return [a.key for a in list(node.anchors.values()) if key.start < a.end <= key.end]

    def _merits_demotion(self, key: ObjectKey) -> bool:
        if self.table.is_pending(key):
            return True  # a put in flight is never dropped for that
        nid = self.table.node_of(key)
        node = self.tree.node(nid) if nid is not None else None
        return node is not None and self.eviction.merits_demotion(node, key.kind)

    # ---------------------------------------------------------------- integrity
    def check_integrity(self) -> None:
        """See ``hybrid_connector.index.integrity.check_index``. Raises ``IntegrityError``."""
        check_index(self)

    def close(self) -> None:
        """Stop the policy's tuner and detach from the backend (which stays open)."""
        self.eviction.close()
        for fp in (self.fingerprint, *self.retired):
            self.backend.detach(fp)
