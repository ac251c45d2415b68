"""``HybridCache``: embedded mode. A ``CacheIndex`` (what is known) and this process's
``Executor`` (the bytes) over one ``ObjectStore``, behind the API an engine drives::

    plan = cache.lookup(prompt)            # scheduler side, no side effects
    saves = cache.plan_saves(prompt)       # where admission wants checkpoints
    lease = cache.acquire(plan)            # lock what will be loaded
    loaded = cache.load(plan)              # worker side: payloads from the tiers
    cache.save_async(tokens, items)        # KV chunks, checkpoints, anchors as produced
    cache.release(lease)
    cache.finish(all_tokens, items)        # final checkpoint (admission), release dead KV

**The hit rule** (never broken): a hit of length p needs KV for every attention layer over
``[0, p)`` and a recurrent state at exactly p (a checkpoint, or anchors covering the replay
window when replay is enabled, labelled approximate), p < prompt length and p a multiple of
the alignment. Anything else is a miss for those tokens (``hybrid_connector.index.hit``).

Saves never block lookups: ``save_async`` decides keys, room and placement under the
index's lock (metadata only) and queues the tier I/O on the executor's lanes; objects are
pending (counted, never planned) until their put lands. ``save`` is ``save_async`` waited
on. Store failures never corrupt the index (see ``CacheIndex``).

Thread safety: every call is safe from any thread; tier I/O runs outside the index's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.hashes import Hashes
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.discovery import Found
from hybrid_connector.index.plan import LoadPlan, LoadResult, SaveItem, SaveResult
from hybrid_connector.index.saving import SaveTicket
from hybrid_connector.index.state import CacheStats, Lease, Policies, check_alignment
from hybrid_connector.policies.base import EvictionPolicy, SavePlan
from hybrid_connector.runtime.api import CacheAPI
from hybrid_connector.tiers.executor import Executor
from hybrid_connector.tiers.ops import Op
from hybrid_connector.tiers.store import ObjectStore
from hybrid_connector.tree.radix import RadixTree

__all__ = ["CacheStats", "HybridCache", "Lease", "check_alignment"]
log = logging.getLogger(__name__)


class HybridCache(CacheAPI):
    """Prefix cache for one model fingerprint over one ``ObjectStore`` whose bytes live in this
    process (``store.executor`` is required); the verbs' contracts are ``CacheAPI``'s. See ``CacheIndex`` for ``layout`` and
    ``model_id``; ``hybrid_connector.assemble`` builds the policies and the store from a
    config."""

    def __init__(self, config: HybridConfig, geometry: ModelGeometry, store: ObjectStore,
                 policies: Policies, layout: dict[str, object] | None = None,
                 model_id: str = "") -> None:
        if store.executor is None:
            raise ValueError("HybridCache needs a store whose bytes live in this process "
                             "(Backend.executor); use CacheIndex for a scheduler-only index")
        self.index = CacheIndex(config, geometry, store, policies, layout, model_id)
        self.store = store
        self.executor: Executor = store.executor
        self._io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hc-load")
        shared = store.ledger.shared_tier
        if shared is not None:
            self.index.shared_view = self.executor.tiers[shared]  # type: ignore[assignment]
        # Warm restart: what the tiers still hold re-links from its metadata.
        self.rebuilt = self.index.rebuild(
            (k, n, m) for t in self.executor.tiers.values() for k, n, m in t.inventory())

    # ---------------------------------------------------------------- views
    @property
    def config(self) -> HybridConfig:
        return self.index.config

    @property
    def geometry(self) -> ModelGeometry:
        return self.index.geometry

    @property
    def fingerprint(self) -> str:
        return self.index.fingerprint

    @property
    def tree(self) -> RadixTree:
        return self.index.tree

    @property
    def stats(self) -> CacheStats:
        return self.index.stats

    @property
    def eviction(self) -> EvictionPolicy:
        return self.index.eviction

    def expected_nbytes(self, kind: ObjectKind, start: int, end: int) -> int:
        """Payload bytes the geometry gives an object (see ``Saver.expected_nbytes``)."""
        return self.index.saver.expected_nbytes(kind, start, end)

    # ---------------------------------------------------------------- lookups
    def lookup(self, tokens: Sequence[int] | np.ndarray, alignment: int | None = None,
               replay: bool | None = None) -> LoadPlan:
        """See ``CacheIndex.lookup``."""
        return self.index.lookup(tokens, alignment, replay)

    def lookup_at(self, tokens: Sequence[int] | np.ndarray, p: int,
                  alignment: int | None = None) -> LoadPlan:
        """See ``CacheIndex.lookup_at``."""
        return self.index.lookup_at(tokens, p, alignment)

    def discover(self, tokens: Sequence[int] | np.ndarray, hashes: Hashes | None = None,
                 alignment: int | None = None) -> Found:
        """See ``CacheIndex.discover``."""
        return self.index.discover(tokens, hashes, alignment=alignment)

    def record_lookup(self, plan: LoadPlan) -> None:
        self.index.record_lookup(plan)

    def plan_saves(self, tokens: Sequence[int] | np.ndarray,
                   alignment: int | None = None) -> SavePlan:
        """See ``CacheIndex.plan_saves``."""
        return self.index.plan_saves(tokens, alignment)

    def final_checkpoint(self, num_tokens: int, alignment: int | None = None) -> int:
        """See ``CacheIndex.final_checkpoint``."""
        return self.index.final_checkpoint(num_tokens, alignment)

    # ---------------------------------------------------------------- leases
    def acquire(self, plan: LoadPlan) -> Lease | None:
        """See ``CacheIndex.acquire``."""
        return self.index.acquire(plan)

    def release(self, lease: Lease | None) -> None:
        """See ``CacheIndex.release``; promotions it decides run on the executor."""
        with self.index.lock:
            self.index.release(lease)
            self._run_drained()

    # ---------------------------------------------------------------- loads
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
        payloads = self.executor.read([r.key for r in refs], [o.tier for o in plan.objects])
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
        # Lost (missing, corrupt, short) is forgotten; only unreachable (a remote that is
        # down: still held) stays indexed for later.
        lost = [r.key for r, t in zip(refs, payloads, strict=True) if t is not None
                and r in failed] + [r.key for r in failed if self.executor.holder(r.key) is None]
        with self.index.lock:
            self.index.report_load(plan, list(dict.fromkeys(lost)))
            self._run_drained()
        log.warning("load of %d/%d objects failed; recomputing", len(failed), len(refs))
        hit = 0
        if not self.index.needs_state:
            hit = min(reach, plan.num_tokens)
            hit -= hit % max(1, plan.alignment)
        return LoadResult(hit, True, tuple(kv), failed=failed, kv_tokens=reach)

    def load_async(self, plan: LoadPlan) -> Future[LoadResult]:
        """``load`` on the cache's I/O thread pool, so slow tiers overlap engine work.
        The plan should be ``acquire``-d until the future completes."""
        return self._io.submit(self.load, plan)

    # ---------------------------------------------------------------- saves
    def save_async(self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem],
                   hashes: Hashes | None = None, start: tuple[int, int] | None = None
                   ) -> Future[SaveResult]:
        """Store objects produced for ``tokens`` (which must cover every item's end).

        Decides under the index's lock (see ``Saver.begin``: checks, keys, room, placement;
        items already present or covered are skipped) and returns at once; the tier I/O
        runs on the executor. The payload tensors belong to the cache until the future is
        done. ``hashes``/``start``: the request's prefix hashes and the ``SaveResult.leaf``
        of its previous save, if the caller keeps them (see ``Saver.begin``). Rejected items are counted and listed in the result, never
        raised. Raises ValueError only for malformed items (see ``SaveItem``) and bad tokens.
        """
        todo = list(items)
        if not todo:
            done: Future[SaveResult] = Future()
            done.set_result(SaveResult(0, 0, 0))
            return done
        with self.index.lock:
            ticket = self.index.begin_save(tokens, [it.spec for it in todo], hashes, start)
            payloads = {k: it.payload for k, it in zip(ticket.keys, todo, strict=True) if k}
            return self._submit(ticket, payloads)

    def save(self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem],
             hashes: Hashes | None = None, start: tuple[int, int] | None = None) -> SaveResult:
        """``save_async`` waited on."""
        return self.save_async(tokens, items, hashes, start).result()

    def _submit(self, ticket: SaveTicket, payloads: dict[Any, torch.Tensor]) -> Future[SaveResult]:
        """Queue a ticket's ops (index lock held, so lanes see decisions in order)."""
        out: Future[SaveResult] = Future()

        def lane_done(indices: list[int], results: list[bool]) -> None:
            with self.index.lock:
                self.index.complete_save(ticket, indices, results)
                self._run_drained()

        def all_done(f: Future[list[bool]]) -> None:
            try:
                f.result()
                out.set_result(self.index.saver.result(ticket))
            except BaseException as exc:  # pragma: no cover - the executor never raises
                out.set_exception(exc)

        self.executor.submit(ticket.ops, payloads, done=lane_done,
                             metas=ticket.metas).add_done_callback(all_done)
        return out

    def _run_drained(self) -> None:
        """Queue the ops the index left (removals, promotions); failed moves are reported
        back like a ticket's (index lock held)."""
        ops: list[Op] = self.index.drain()
        if ops:
            self._submit(SaveTicket(0, tuple(ops), (), 0, (), 0), {})

    def finish(self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem] = (),
               prompt_len: int | None = None, hashes: Hashes | None = None,
               start: tuple[int, int] | None = None) -> SaveResult:
        """End of a request: save its last objects (the final checkpoint only if admission
        keeps it), release KV on its path that can no longer produce a hit, and tell the
        eviction policy about the request (``prompt_len``: how many of ``tokens`` were the
        prompt, default all). An empty request is a no-op. Raises ValueError for
        ``prompt_len`` outside ``[0, len(tokens)]``."""
        arr = np.asarray(tokens)
        todo = list(items)
        if arr.size == 0:
            self.index.finish(tokens, prompt_len)
            return SaveResult(0, 0, 0)
        kept = [it for it in todo if self.index.saver.keeps(int(arr.size), it.spec)]
        result = self.save(tokens, kept, hashes, start)
        with self.index.lock:
            self.index.finish(tokens, prompt_len)
            self._run_drained()
        return result

    # ---------------------------------------------------------------- upkeep
    def flush(self) -> None:
        """Wait until every queued tier op has run (their completions included)."""
        self.executor.flush()

    def check_integrity(self) -> None:
        """``CacheIndex.check_integrity`` plus the ledger's own accounting."""
        self.index.check_integrity()
        with self.store.lock:
            self.store.ledger.check()

    def detach(self) -> None:
        """Wait for in-flight loads and saves, stop the policy's tuner and detach from the
        store, which stays open (a server's other models still use it)."""
        self._io.shutdown(wait=True)
        self.executor.flush()
        self.index.close()

    def close(self) -> None:
        """``detach``, then close the store."""
        self.detach()
        self.store.close()
