"""``HybridCache``: the engine-neutral facade over the radix index, policies and store.

Life of a request, as an engine drives it::

    plan = cache.lookup(prompt)            # scheduler side, no side effects
    saves = cache.plan_saves(prompt)       # where admission wants checkpoints
    lease = cache.acquire(plan)            # lock what will be loaded
    loaded = cache.load(plan)              # worker side: payloads from the store
    cache.save(tokens, items)              # KV chunks, checkpoints, anchors as produced
    cache.release(lease)
    cache.finish(all_tokens, items)        # final checkpoint (admission), release dead KV

**The hit rule** (never broken): a hit of length p needs KV for every attention layer over
``[0, p)`` and a recurrent state at exactly p (a checkpoint, or anchors covering the replay
window when replay is enabled, labelled approximate), p < prompt length and p a multiple of
the alignment. Anything else is a miss for those tokens.

Thread safety: every public method takes one lock; store I/O in ``load`` runs outside it on
objects the caller should have locked with ``acquire``.

Store failures never corrupt the index: an object the store drops or fails to read is
unindexed (a locked checkpoint at the release of its last lease), objects the store holds
that the index does not know (a previous run's files) are reclaimed oldest first under
budget pressure, and a save that stores nothing leaves the tree as it was.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from hybrid_connector.config import HybridConfig
from hybrid_connector.keys import ObjectKey, ObjectKind, PrefixHasher, as_tokens, model_fingerprint
from hybrid_connector.model import ModelGeometry
from hybrid_connector.plan import (
    SLOW_TIERS,
    LoadPlan,
    LoadResult,
    PlannedObject,
    Rejection,
    SaveItem,
    SaveResult,
)
from hybrid_connector.policies import build
from hybrid_connector.policies.anchors import anchor_block_bytes
from hybrid_connector.policies.base import AdmissionPolicy, EvictionPolicy, SavePlan
from hybrid_connector.radix import IntegrityError, MatchResult, Node, ObjectRef, RadixTree
from tiers.store import ObjectStore, StoreHooks

log = logging.getLogger(__name__)


@dataclass
class CacheStats:
    """Running counters (mutable, owned by the cache; copy before publishing)."""

    lookups: int = 0
    hits: int = 0
    approx_hits: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    stored: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in ObjectKind})
    rejected: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in ObjectKind})
    evicted: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in ObjectKind})
    load_failures: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


@dataclass(frozen=True)
class Lease:
    """Locks taken by ``acquire``; pass back to ``release`` exactly once (a second release
    raises ValueError)."""

    id: int
    kv_nodes: tuple[int, ...]
    state_node: int
    anchor_nodes: tuple[int, ...]
    keys: tuple[ObjectKey, ...] = ()


def check_alignment(alignment: int) -> int:
    """``alignment`` if it is a positive int, else ValueError."""
    if isinstance(alignment, bool) or not isinstance(alignment, int | np.integer) or alignment <= 0:
        raise ValueError(f"alignment must be a positive integer, got {alignment!r}")
    return int(alignment)


class HybridCache:
    """Prefix cache for one model fingerprint over one ``ObjectStore``."""

    def __init__(
        self,
        config: HybridConfig,
        geometry: ModelGeometry,
        store: ObjectStore,
        eviction: EvictionPolicy | None = None,
        admission: AdmissionPolicy | None = None,
        layout: dict[str, object] | None = None,
        model_id: str = "",
    ) -> None:
        """``model_id`` names the weights (e.g. ``org/model@revision``) and ``layout`` holds
        engine facts that change stored bytes (block size, KV layout, TP rank); both enter
        the fingerprint with the geometry, so objects of other weights, geometry, dtype or
        layout can never be loaded."""
        self.config = config
        self.geometry = geometry
        self.store = store
        self.tree = RadixTree(on_move=self._on_move)
        self.fingerprint = model_fingerprint(
            {**geometry.fingerprint_fields(), "chunk": config.chunk_size,
             "hash_block": config.hash_block_size, "model_id": model_id, **(layout or {})}
        )
        self.needs_state = bool(geometry.recurrent_layers)
        self.eviction = eviction or build.eviction(config)
        self.admission = admission or build.admission(config)
        self.eviction.bind(self.tree, geometry, self._evictable)
        self.stats = CacheStats()
        self._clock = 0.0
        self._lock = threading.RLock()
        self._where: dict[ObjectKey, int] = {}  # key -> node id holding its ref
        self._max_kv_len = config.chunk_size  # longest KV chunk stored (bounds searches)
        # keys of the batch ``save`` is putting -> still held by the store
        self._in_flight: dict[ObjectKey, bool] = {}
        self._io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hc-load")
        self._leases: dict[int, Lease] = {}
        self._next_lease = 1
        self._leased: Counter[ObjectKey] = Counter()  # keys under an active lease
        # Checkpoints the store lost while locked: unindexed at the release of their lease.
        self._doomed: set[ObjectKey] = set()
        store.attach(self.fingerprint, StoreHooks(
            self._on_store_drop, self._merits_demotion, self._anchors_of_chunk))
        # What the store holds for this model that this (new) index does not know, oldest
        # first: a previous run's objects. Reclaimed before anything indexed is evicted.
        self._orphans = {k: [key for key in store.keys(k) if key.fingerprint == self.fingerprint]
                         for k in ObjectKind}

    # ---------------------------------------------------------------- lookup
    def lookup(
        self, tokens: Sequence[int] | np.ndarray, alignment: int | None = None,
        replay: bool | None = None,
    ) -> LoadPlan:
        """The longest usable hit for ``tokens`` under the hit rule. No side effects.

        ``alignment`` (default ``config.alignment``) restricts hit lengths to its multiples.
        ``replay`` (default ``config.replay``) allows approximate anchor-replay plans; pass
        False for the best exact plan, e.g. when a quality gate refused a replay. Raises
        ValueError for non-integer or negative tokens and a non-positive alignment.
        """
        arr = as_tokens(tokens)
        align = self._alignment(alignment)
        with self._lock:
            m = self.tree.match(arr)
            limit = min(m.length, arr.size - 1)
            if limit <= 0:
                return LoadPlan(0, True, matched_tokens=m.length, prompt_tokens=int(arr.size))
            nodes = list(m.path) + ([m.partial] if m.partial is not None else [])
            chain, reach = self._kv_chain(m)
            best_p, best_node = 0, self.tree.root
            if self.needs_state:
                for node in m.path:
                    if (self._usable_state(node) and node.depth <= min(limit, reach)
                            and node.depth % align == 0 and node.depth > best_p):
                        best_p, best_node = node.depth, node
            else:
                best_p = (min(limit, reach) // align) * align
                best_node = m.path[-1] if m.path else self.tree.root
            use_replay = self.config.replay if replay is None else replay
            found = (self._replay_candidate(nodes, min(limit, reach), align, best_p)
                     if use_replay else None)
            if found is not None:
                p, anchors = found
                holder = next(n for n in nodes if n.start < p <= n.depth)
                return self._plan(arr, chain, p, None, anchors, reach, m.length, holder, align)
            if best_p == 0:
                return LoadPlan(0, True, kv_tokens=reach, matched_tokens=m.length,
                                prompt_tokens=int(arr.size))
            return self._plan(arr, chain, best_p, best_node.state, [], reach, m.length,
                              best_node, align)

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
        with self._lock:
            m = self.tree.match(arr)
            if not 0 < p < arr.size or p > m.length:
                return LoadPlan(0, True, matched_tokens=m.length, prompt_tokens=int(arr.size))
            chain, reach = self._kv_chain(m)
            node = next((n for n in m.path if n.depth == p), None)
            if reach < p or (self.needs_state and (node is None or not self._usable_state(node))):
                return LoadPlan(0, True, kv_tokens=reach, matched_tokens=m.length,
                                prompt_tokens=int(arr.size))
            target = node if node is not None else self.tree.root
            return self._plan(arr, chain, int(p), target.state, [], reach, m.length, target, align)

    def _alignment(self, alignment: int | None) -> int:
        return check_alignment(self.config.alignment if alignment is None else alignment)

    def _usable_state(self, node: Node) -> bool:
        return node.state is not None and node.state.key not in self._doomed

    def _kv_candidates(self, m: MatchResult) -> list[Node]:
        """Nodes whose KV chunks may serve the match: the matched path, the partially
        matched node, and descendants below the match point whose chunks can start before
        it (a chunk ending past a branch point still holds the shared tokens before it)."""
        nodes = list(m.path)
        frontier = [m.partial] if m.partial is not None else list(m.node.children.values())
        bound = m.length + self._max_kv_len
        while frontier:
            node = frontier.pop()
            nodes.append(node)
            frontier.extend(c for c in node.children.values() if c.start < bound)
        return nodes

    def _kv_chain(self, m: MatchResult) -> tuple[list[ObjectRef], int]:
        """KV chunks covering ``[0, reach)`` contiguously from 0, along the matched path.

        A chunk that runs past the match still serves its matched part: KV at position i
        depends only on tokens ``[0, i]``. So ``reach`` is capped at the match length.
        """
        matched = m.length
        by_start: dict[int, ObjectRef] = {}
        for node in self._kv_candidates(m):
            for end, ref in node.kv.items():
                if ref.start < matched and (ref.start not in by_start
                                            or by_start[ref.start].end < end):
                    by_start[ref.start] = ref
        chain, reach = [], 0
        while reach < matched and reach in by_start:
            ref = by_start[reach]
            chain.append(ref)
            reach = ref.end
        return chain, min(reach, matched)

    def _replay_candidate(
        self, nodes: Sequence[Node], limit: int, align: int, exact_p: int
    ) -> tuple[int, list[ObjectRef]] | None:
        """Deepest page end p > exact_p whose replay window ``[start, p)`` is covered by
        whole anchor pages, contiguously (each page ``[e - page, e)``, none missing)."""
        if not self.needs_state:
            return None
        page = self.config.anchor_page_size
        anchors = {e: r for n in nodes for e, r in n.anchors.items()
                   if e <= limit and r.start == e - page and r.start % page == 0}
        for p in sorted(anchors, reverse=True):
            if p <= exact_p or p % align or p % page:
                continue
            window = min(int(self.config.replay_budget_frac * p), self.config.replay_max_tokens)
            window = max(page, window - window % page)
            start = max(0, p - window)
            pages = [anchors.get(e) for e in range(start + page, p + 1, page)]
            if pages and all(r is not None for r in pages):
                return p, [r for r in pages if r is not None]
        return None

    def _plan(
        self, arr: np.ndarray, chain: list[ObjectRef], p: int, state: ObjectRef | None,
        anchors: list[ObjectRef], reach: int, matched: int, node: Node, align: int,
    ) -> LoadPlan:
        kv = [r for r in chain if r.start < p]
        refs = [*kv, *([state] if state else []), *anchors]
        tiers = self.store.where([r.key for r in refs])
        if any(t is None for t in tiers):
            # The index lags a store drop: never promise what cannot be read.
            return LoadPlan(0, True, kv_tokens=reach, matched_tokens=matched,
                            prompt_tokens=int(arr.size))
        planned = [PlannedObject(r, t) for r, t in zip(refs, tiers, strict=True) if t]
        n_kv = len(kv)
        return LoadPlan(
            num_tokens=p,
            exact=state is not None or not self.needs_state,
            kv=tuple(planned[:n_kv]),
            state=planned[n_kv] if state else None,
            anchors=tuple(planned[n_kv + (1 if state else 0):]),
            replay_from=anchors[0].start if anchors else p,
            kv_tokens=reach,
            matched_tokens=matched,
            prompt_tokens=int(arr.size),
            node_id=node.id,
            is_async=any(o.tier in SLOW_TIERS for o in planned),
            alignment=align,
        )

    def record_lookup(self, plan: LoadPlan) -> None:
        """Count a lookup in the statistics (separate so ``lookup`` stays pure)."""
        with self._lock:
            self.stats.lookups += 1
            self.stats.prompt_tokens += plan.prompt_tokens
            if plan.hit:
                self.stats.hits += 1
                self.stats.hit_tokens += plan.num_tokens
                self.stats.approx_hits += not plan.exact

    # ------------------------------------------------------------ save plans
    def plan_saves(
        self, tokens: Sequence[int] | np.ndarray, alignment: int | None = None
    ) -> SavePlan:
        """Where admission wants checkpoints while ``tokens`` (a prompt) is prefilled, by
        speculative insertion. No side effects. Raises ValueError for a non-positive
        alignment."""
        arr = as_tokens(tokens)
        align = self._alignment(alignment)
        with self._lock:
            m = self.tree.match(arr)
            positions = self.admission.state_positions(self.tree, m, arr, align)
            _, reach = self._kv_chain(m)
            kv_from = reach - reach % self.config.chunk_size
            return SavePlan(tuple(sorted(set(positions))), m.branch_point, kv_from)

    def final_checkpoint(self, num_tokens: int, alignment: int | None = None) -> int:
        """Where the end-of-request checkpoint must be taken to be usable: the last
        aligned position at or before ``num_tokens`` (an unaligned state can never hit).
        The KV chunk running across it is kept with it (see ``_serves_ancestor_state``);
        engines that can should also end a KV chunk exactly there."""
        align = self._alignment(alignment)
        return num_tokens - num_tokens % align

    # ----------------------------------------------------------------- locks
    def acquire(self, plan: LoadPlan) -> Lease | None:
        """Lock the plan's objects against eviction and count it as an access.

        Returns ``None`` (and locks nothing) when the plan went stale: its node left the
        tree or an object was dropped since ``lookup``; the caller should look up again.
        """
        if not plan.hit:
            return None
        with self._lock:
            node = self.tree.node(plan.node_id)
            if node is None or any(self._where.get(o.ref.key) is None or o.ref.key in self._doomed
                                   for o in plan.objects):
                return None
            # KV locks run to the root: lock the node holding p and every node holding a
            # planned chunk (a chunk may end below the hit, past a branch point).
            kv_nodes = tuple(sorted(
                {self._deepest_holder(node, plan.num_tokens).id}
                | {self._where[o.ref.key] for o in plan.kv}
            ))
            for nid in kv_nodes:
                self.tree.lock_kv(self._node(nid))
            state_node = 0
            if plan.state is not None:
                self.tree.lock_state(node)
                state_node = node.id
            anchor_nodes = tuple(sorted({self._where[o.ref.key] for o in plan.anchors}))
            for nid in anchor_nodes:
                self.tree.lock_anchors(self._node(nid))
            keys = tuple(o.ref.key for o in plan.objects)
            self.store.pin(keys)  # no demotion under an in-flight load
            self._clock += 1
            self.eviction.on_access(self.tree.path_to(node), self._clock)
            node.hits += 1
            lease = Lease(self._next_lease, kv_nodes, state_node, anchor_nodes, keys)
            self._next_lease += 1
            self._leases[lease.id] = lease
            self._leased.update(keys)
            return lease

    def _deepest_holder(self, node: Node, p: int) -> Node:
        """The node on ``node``'s path whose edge holds position p (``0 < p <= depth``)."""
        cur = node
        while cur.parent is not None and cur.start >= p:
            cur = cur.parent
        return cur

    def release(self, lease: Lease | None) -> None:
        """Drop the locks of ``acquire`` (safe with ``None``); then unindex what the store
        lost while this lease held it. Raises ValueError for a lease already released (or
        made by another cache), without touching any lock."""
        if lease is None:
            return
        with self._lock:
            if self._leases.pop(lease.id, None) != lease:
                raise ValueError(f"lease {lease.id} was already released (or is not this cache's)")
            for nid in lease.kv_nodes:
                self.tree.lock_kv(self._node(nid), -1)
            if lease.state_node:
                self.tree.lock_state(self._node(lease.state_node), -1)
            for nid in lease.anchor_nodes:
                self.tree.lock_anchors(self._node(nid), -1)
            self.store.unpin(lease.keys)
            self._leased.subtract(lease.keys)
            for key in lease.keys:
                if self._leased[key] <= 0:
                    del self._leased[key]
            for key in [k for k in lease.keys if k in self._doomed]:
                self._unindex(key, remove=True)

    def _node(self, node_id: int) -> Node:
        node = self.tree.node(node_id)
        if node is None:
            raise KeyError(f"node {node_id} is gone while locked (bookkeeping bug)")
        return node

    # ------------------------------------------------------------------ load
    def load(self, plan: LoadPlan) -> LoadResult:
        """Read the plan's payloads; never raises for store failures.

        An object that is missing, unreadable or of the wrong size is reported in
        ``failed`` and unindexed (a locked checkpoint when its last lease is released), so
        the next save stores it again. What survives of the hit: with recurrent layers,
        nothing (the state, or the anchors, at p is needed together with every KV chunk
        before p: the engine recomputes from 0); without them, the KV prefix read up to the
        first failed chunk, rounded down to the plan's alignment (the engine recomputes
        from there). ``kv``/``kv_tokens`` always give the chunks read contiguously.
        """
        if not plan.hit:
            return LoadResult(0, True)
        refs = [o.ref for o in plan.objects]
        payloads = self.store.get([r.key for r in refs])
        good = [t is not None and t.numel() * t.element_size() == r.nbytes
                for r, t in zip(refs, payloads, strict=True)]
        failed = tuple(r for r, ok in zip(refs, good, strict=True) if not ok)
        n_kv = len(plan.kv)
        kv: list[torch.Tensor] = []
        reach = 0
        for ref, t, ok in zip(refs[:n_kv], payloads[:n_kv], good[:n_kv], strict=True):
            if not ok or t is None:
                break
            kv.append(t)
            reach = ref.end
        reach = min(reach, plan.kv_tokens)
        if not failed:
            state = payloads[n_kv] if plan.state is not None else None
            anchors = tuple(t for t in payloads[n_kv + (1 if plan.state else 0):] if t is not None)
            return LoadResult(plan.num_tokens, plan.exact, tuple(kv), state, anchors,
                              kv_tokens=reach)
        with self._lock:
            self.stats.load_failures += 1
            for ref in failed:
                self._unindex(ref.key, remove=True)
        log.warning("load of %d/%d objects failed; recomputing", len(failed), len(refs))
        hit = 0
        if not self.needs_state:
            hit = min(reach, plan.num_tokens)
            hit -= hit % max(1, plan.alignment)
        return LoadResult(hit, True, tuple(kv), failed=failed, kv_tokens=reach)

    def load_async(self, plan: LoadPlan) -> Future[LoadResult]:
        """``load`` on the cache's I/O thread pool, so slow tiers overlap engine work.
        The plan should be ``acquire``-d until the future completes."""
        return self._io.submit(self.load, plan)

    # ------------------------------------------------------------------ save
    def save(self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem]) -> SaveResult:
        """Store objects produced for ``tokens`` (which must cover every item's end).

        Inserts ``tokens`` into the index, makes room for the whole batch (reclaiming
        unindexed objects first, then evicting by policy), hands the new objects to the
        store in ONE batched ``put`` (so tiers amortise fsyncs and round trips), then
        indexes what was stored, splitting where a checkpoint needs a node boundary.
        Objects already present are skipped, and so is a KV chunk that a stored chunk with
        the same end and an earlier (or equal) start already covers; a chunk covering more
        replaces the stored one. Rejected items (see ``Rejection``) are counted and listed,
        never raised; the index is unchanged for them, and a save that stores nothing
        leaves the tree as it was. Raises ValueError only for malformed items (see
        ``SaveItem``) and bad tokens.
        """
        arr = as_tokens(tokens)
        todo = sorted(items, key=lambda it: (it.end, it.kind.value))
        if not todo:
            return SaveResult(0, 0, 0)
        hasher = PrefixHasher(arr, self.config.hash_block_size)
        present = evicted = 0
        refused: list[Rejection] = []
        kept: list[bool] = []
        with self._lock:
            first_new = self.tree.next_id
            top = max((it.end for it in todo if it.end <= arr.size), default=0)
            leaf = self.tree.insert(arr[:top])
            self.tree.lock_kv(leaf)  # keep the path alive while we evict for room
            try:
                self._heal(hasher, todo)
                # 1. checks, keys, duplicates, room for the whole batch (evictions only here)
                batch: list[tuple[ObjectKey, torch.Tensor]] = []
                batched: set[ObjectKey] = set()
                pending = dict.fromkeys(ObjectKind, 0)
                for it in todo:
                    reason = self._check_item(it, int(arr.size))
                    if reason is not None:
                        refused.append(Rejection(it.kind, it.start, it.end, reason))
                        continue
                    key = ObjectKey(self.fingerprint, hasher.at(it.end), it.kind, it.start, it.end)
                    if ((key in self._where and key not in self._doomed) or key in batched
                            or self._covered(leaf, key)):
                        present += 1
                        continue
                    nbytes = it.payload.numel() * it.payload.element_size()
                    if nbytes > self.store.max_object_bytes(it.kind):
                        refused.append(Rejection(it.kind, it.start, it.end, "too_large"))
                        continue
                    pending[it.kind] += nbytes
                    ok, freed = self._make_room(it.kind, pending, batched)
                    evicted += freed
                    if not ok:
                        pending[it.kind] -= nbytes
                        refused.append(Rejection(it.kind, it.start, it.end, "no_room"))
                        continue
                    batch.append((key, it.payload))
                    batched.add(key)
                # 2. one batched put
                self._in_flight = dict.fromkeys(batched, True)
                try:
                    done = self.store.put(batch) if batch else []
                    kept = [ok and self._in_flight[k] for (k, _), ok in zip(batch, done, strict=True)]
                finally:
                    self._in_flight = {}
                # 3. index what the store took (parent pointers stay valid: no radix match)
                for (key, payload), ok in zip(batch, kept, strict=True):
                    if ok:
                        self._index(leaf, key, payload.numel() * payload.element_size())
                        self.stats.stored[key.kind.value] += 1
                    else:
                        refused.append(Rejection(key.kind, key.start, key.end, "store"))
            finally:
                self.tree.lock_kv(leaf, -1)
            for r in refused:
                self.stats.rejected[r.kind.value] += 1
            survivor = self._tidy_new(leaf, first_new)
            self._clock += 1
            self.eviction.on_access(self.tree.path_to(survivor), self._clock)
        return SaveResult(sum(kept), present, len(refused), evicted, tuple(refused))

    def _heal(self, hasher: PrefixHasher, items: Sequence[SaveItem]) -> None:
        """Unindex objects of this save that the index lists but the store lost without
        telling (a restarted remote), so they are stored again instead of "present"."""
        n = hasher.tokens.size
        keys = [ObjectKey(self.fingerprint, hasher.at(it.end), it.kind, it.start, it.end)
                for it in items if it.end <= n]
        keys = [k for k in keys if k in self._where and k not in self._doomed]
        for key, tier in zip(keys, self.store.where(keys) if keys else [], strict=True):
            if tier is None:
                self._unindex(key, remove=False)

    def expected_nbytes(self, kind: ObjectKind, start: int, end: int) -> int:
        """Payload bytes the geometry gives an object (per TP rank): ``end - start`` tokens
        of KV, one checkpoint, or one page's anchor block."""
        if kind is ObjectKind.KV:
            return (end - start) * self.geometry.kv_bytes_per_token()
        if kind is ObjectKind.STATE:
            return self.geometry.state_bytes()
        density = self.config.anchor_density or 1.0 / self.config.anchor_page_size
        return anchor_block_bytes(self.geometry, self.config.anchor_page_size, density)

    def _check_item(self, it: SaveItem, n: int) -> str | None:
        """Why ``it`` cannot be stored for ``n`` tokens (None: it can)."""
        if it.end > n or (it.kind is ObjectKind.STATE and it.end == 0):
            return "outside"
        page = self.config.anchor_page_size
        if it.kind is ObjectKind.ANCHOR and (it.start % page or it.end - it.start != page):
            return "page"
        if it.payload.numel() * it.payload.element_size() != self.expected_nbytes(
                it.kind, it.start, it.end):
            return "size"
        return None

    def _covered(self, leaf: Node, key: ObjectKey) -> bool:
        """Is KV chunk ``key`` redundant: a stored chunk with its end starts at or before
        it? (One that starts later is replaced, unless a lease holds it.)"""
        if key.kind is not ObjectKind.KV:
            return False
        old = self._deepest_holder(leaf, key.end).kv.get(key.end)
        return old is not None and (old.start <= key.start or old.key in self._leased)

    def _make_room(self, kind: ObjectKind, pending: Mapping[ObjectKind, int],
                   keep: set[ObjectKey]) -> tuple[bool, int]:
        """Until the store fits ``pending`` (the batch so far, this item included): reclaim
        objects this index does not know, oldest first, then evict by policy, for ``kind``
        and the kinds sharing its budget. A victim that frees no bytes is still progress
        (it left the tree). Returns (fits, bytes freed). ``keep``: keys of the batch."""
        freed = 0
        kinds = self.store.room_kinds(kind)
        while not self.store.fits(pending):
            for k in kinds:
                got = self._reclaim_orphan(k, keep)
                if got is None:
                    got = self._evict_one(k)
                if got is not None:
                    freed += got
                    break
            else:
                return False, freed
        return True, freed

    def _reclaim_orphan(self, kind: ObjectKind, keep: set[ObjectKey]) -> int | None:
        """Remove the oldest object of ``kind`` the store holds for this model but the
        index does not know; its bytes (None: there is none left)."""
        queue = self._orphans[kind]
        while queue:
            key = queue.pop(0)
            if key in self._where or key in keep or self.store.where([key])[0] is None:
                continue  # indexed since (saved again), part of this batch, or gone
            before = self.store.used(kind)
            self.store.remove([key])
            return max(0, before - self.store.used(kind))
        return None

    def _index(self, leaf: Node, key: ObjectKey, nbytes: int) -> None:
        """Attach a stored object to the node on ``leaf``'s (locked) path holding its end."""
        node = self._deepest_holder(leaf, key.end)
        ref = ObjectRef(key, nbytes)
        self._doomed.discard(key)  # stored again: valid
        if key.kind is ObjectKind.STATE:
            if node.depth != key.end:
                node = self.tree.split(node, key.end)
            self.tree.set_state(node, ref)
        elif key.kind is ObjectKind.KV:
            old = self.tree.add_kv(node, ref)
            if old is not None and old.key != key:  # a chunk covering more replaced it
                self._where.pop(old.key, None)
                self.store.remove([old.key])
            self._max_kv_len = max(self._max_kv_len, key.end - key.start)
        else:
            self.tree.add_anchor(node, ref)
        self._where[key] = node.id
        self.eviction.on_change(node)

    def _tidy_new(self, leaf: Node, first_new: int) -> Node:
        """Undo what ``insert`` created for a save but nothing uses: object-less leaves
        made by this save go, and a node this save split off folds back into its child.
        Returns the deepest surviving node of the path."""
        cur = leaf
        while (cur.id >= first_new and self.tree.can_remove(cur) and not cur.kv
               and not cur.anchors and cur.state is None):
            parent = cur.parent
            self._remove_leaf(cur)
            assert parent is not None
            cur = parent
        if cur.id >= first_new and self.tree.can_merge(cur):
            nid = cur.id
            cur = self.tree.merge_into_child(cur)
            self.eviction.on_remove(nid)
            self.eviction.on_change(cur)
        return cur

    def finish(
        self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem] = (),
        prompt_len: int | None = None,
    ) -> SaveResult:
        """End of a request: save its last objects (the final checkpoint only if admission
        keeps it), release KV on this path that can no longer produce a hit, and tell the
        eviction policy about the request (``prompt_len``: how many of ``tokens`` were the
        prompt, default all; workload-adaptive policies such as the alpha tuner learn from
        it). An empty request is a no-op. Raises ValueError for ``prompt_len`` outside
        ``[0, len(tokens)]``."""
        arr = as_tokens(tokens)
        plen = int(arr.size) if prompt_len is None else prompt_len
        if not 0 <= plen <= arr.size:
            raise ValueError(f"prompt_len {prompt_len} outside [0, {arr.size}]")
        if arr.size == 0:
            return SaveResult(0, 0, 0)
        final = self.final_checkpoint(int(arr.size))
        keep = [
            it for it in items
            if it.kind is not ObjectKind.STATE or it.end != final
            or self.admission.admit_final(int(arr.size))
        ]
        result = self.save(arr, keep)
        with self._lock:
            m = self.tree.match(arr)
            self._prune_upward(m.node)
            if plen:
                self.eviction.on_request(arr, plen)
        return result

    # -------------------------------------------------------------- eviction
    def _useful_anchors(self, node: Node) -> bool:
        return self.config.replay and bool(node.anchors)

    def _evictable(self, node: Node, kind: ObjectKind) -> bool:
        """May the cache take ``kind`` from ``node`` now? (policies call this)"""
        if node is self.tree.root:
            return False
        if kind is ObjectKind.KV:
            return self.tree.can_remove(node)
        if kind is ObjectKind.STATE:
            return node.state is not None and not node.state_lock
        return bool(node.anchors) and not node.anchor_lock

    def _evict_one(self, kind: ObjectKind) -> int | None:
        """Evict one victim's objects of ``kind`` (a KV victim takes its whole leaf);
        return the bytes freed over all kinds (None: no victim)."""
        node = self.eviction.next_victim(kind)
        if node is None or not self._evictable(node, kind):
            return None
        before = {k: self.store.used(k) for k in ObjectKind}
        if kind is ObjectKind.KV:
            parent = node.parent
            self._forget(self._remove_leaf(node))
            if parent is not None:
                self._prune_upward(parent)
        elif kind is ObjectKind.STATE:
            ref = self.tree.drop_state(node)
            self._forget([ref] if ref else [])
            self._after_state_loss(node)
        else:
            refs = list(node.anchors.values())
            for r in refs:
                self.tree.drop_ref(node, r)
            self._forget(refs)
            self._prune_upward(node)
        freed = 0
        for k, b in before.items():
            got = max(0, b - self.store.used(k))
            self.stats.evicted[k.value] += got
            freed += got
        return freed

    def _remove_leaf(self, node: Node) -> list[ObjectRef]:
        nid = node.id
        refs = self.tree.remove_leaf(node)
        self.eviction.on_remove(nid)
        return refs

    def _after_state_loss(self, node: Node) -> None:
        """A node lost its state: release it if dead, fold it if it is a pass-through, and
        release child leaves that were kept only to serve that state."""
        if node.is_leaf:
            self._prune_upward(node)
            return
        for child in list(node.children.values()):
            if child.is_leaf:
                self._prune_upward(child)  # may release ``node`` too, walking up
        if self.tree.node(node.id) is not node or node.is_leaf:
            return
        if self.tree.can_merge(node):
            nid = node.id
            child = self.tree.merge_into_child(node)
            self.eviction.on_remove(nid)
            self.eviction.on_change(child)

    def _prune_upward(self, node: Node) -> None:
        """Release leaves whose KV can no longer produce a hit (no state, no usable
        anchors, unlocked), walking up while that holds."""
        if not self.needs_state:
            return
        cur: Node | None = node
        while (cur is not None and self.tree.can_remove(cur) and cur.state is None
               and not self._useful_anchors(cur) and not self._serves_ancestor_state(cur)):
            parent = cur.parent
            self._forget(self._remove_leaf(cur))
            cur = parent

    @staticmethod
    def _serves_ancestor_state(node: Node) -> bool:
        """Does a KV chunk on ``node`` start before its edge and reach across an ancestor's
        checkpoint? (A chunk saved past a checkpoint, e.g. a request's tail chunk past its
        aligned final checkpoint, is the only KV for the tokens just before that
        checkpoint: releasing it would strand the state.)"""
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

    def _forget(self, refs: Sequence[ObjectRef]) -> None:
        for r in refs:
            self._where.pop(r.key, None)
        self.store.remove([r.key for r in refs])

    def _on_move(self, node: Node, refs: Iterable[ObjectRef]) -> None:
        for r in refs:
            self._where[r.key] = node.id

    # ------------------------------------------------------- store callbacks
    def _on_store_drop(self, keys: Sequence[ObjectKey]) -> None:
        """The store dropped objects on its own: forget them so no plan promises them."""
        with self._lock:
            for key in keys:
                if key in self._in_flight:
                    self._in_flight[key] = False  # dropped during its own put: do not index
                    continue
                self._unindex(key, remove=False)

    def _unindex(self, key: ObjectKey, remove: bool) -> None:
        """Forget one object the store lost or failed to read (``remove``: also delete
        whatever bytes of it the store still has). A checkpoint under a lease stays
        indexed, marked doomed (never planned again), until the lease is released."""
        nid = self._where.get(key)
        node = self.tree.node(nid) if nid is not None else None
        if node is None:
            self._where.pop(key, None)
            self._doomed.discard(key)
            return
        if key.kind is ObjectKind.STATE and node.state_lock:
            self._doomed.add(key)
            return
        self._doomed.discard(key)
        for ref in (node.state, node.kv.get(key.end), node.anchors.get(key.end)):
            if ref is not None and ref.key == key:
                self.tree.drop_ref(node, ref)
                del self._where[key]
                if remove:
                    self.store.remove([key])
                self.eviction.on_change(node)
                if key.kind is ObjectKind.STATE:
                    self._after_state_loss(node)
                return

    def _anchors_of_chunk(self, key: ObjectKey) -> list[ObjectKey]:
        """Anchor pages ending inside KV chunk ``key`` (they die with it). Lock free: the
        store calls this under its own lock, often while this thread holds ours."""
        nid = self._where.get(key)
        node = self.tree.node(nid) if nid is not None else None
        if node is None:
            return []
        return [a.key for a in list(node.anchors.values()) if key.start < a.end <= key.end]

    def _merits_demotion(self, key: ObjectKey) -> bool:
        if key in self._in_flight:
            return True  # part of the batch being put: not indexed yet, never dropped for that
        nid = self._where.get(key)
        node = self.tree.node(nid) if nid is not None else None
        return node is not None and self.eviction.merits_demotion(node, key.kind)

    # ------------------------------------------------------------- integrity
    def check_integrity(self) -> None:
        """Tree invariants plus: every ref is indexed in ``_where`` at its node, doomed
        keys are indexed and locked, and every lock in the tree belongs to an active lease
        (so a lost or doubled release shows). Raises ``IntegrityError``."""
        with self._lock:
            self.tree.check_integrity()
            seen = 0
            for node in self.tree.nodes():
                refs = [*node.kv.values(), *node.anchors.values()]
                if node.state is not None:
                    refs.append(node.state)
                for r in refs:
                    seen += 1
                    if self._where.get(r.key) != node.id:
                        raise IntegrityError(f"{r.key} not indexed at node {node.id}")
                    if r.key.fingerprint != self.fingerprint:
                        raise IntegrityError(f"{r.key} has a foreign fingerprint")
            if seen != len(self._where):
                raise IntegrityError(f"{len(self._where) - seen} indexed keys are not in the tree")
            for key in self._doomed:
                holder = self.tree.node(self._where.get(key, -1))
                if (holder is None or holder.state is None or holder.state.key != key
                        or not holder.state_lock):
                    raise IntegrityError(f"doomed {key} is not a locked checkpoint")
            want: Counter[tuple[str, int]] = Counter()
            for lease in self._leases.values():
                want.update(("kv", n) for n in lease.kv_nodes)
                want.update(("anchor", n) for n in lease.anchor_nodes)
                if lease.state_node:
                    want[("state", lease.state_node)] += 1
            for node in self.tree.nodes():
                for what, have in (("kv", node.kv_lock_own), ("state", node.state_lock),
                                   ("anchor", node.anchor_lock)):
                    if have != want[(what, node.id)]:
                        raise IntegrityError(f"{node}: {have} {what} locks, leases hold "
                                             f"{want[(what, node.id)]}")

    def close(self) -> None:
        """Wait for in-flight async loads, stop the policy's tuner, detach from the store,
        then close the store."""
        self._io.shutdown(wait=True)
        self.eviction.close()
        self.store.detach(self.fingerprint)
        self.store.close()
