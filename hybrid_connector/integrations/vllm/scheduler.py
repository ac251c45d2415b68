"""The scheduler side of the vLLM connector: the index (no bytes) in the engine-core
process, answering vLLM's hit queries under the hit rule and turning vLLM's steps into
load and save jobs for the TP workers (``RankGather`` merges their reports).

Hits (``match``): exact only (stock vLLM cannot replay anchors), at a block boundary or at
a saved end-of-request state (below), below the request's token count (vLLM recomputes the
last token), deeper than the engine's own hit; reported as async so the state lands in its
block before ``preprocess_mamba`` copies it to the running block. Saves (``saves_for``): KV
chunks on the ``chunk_size`` grid (cut at kept checkpoints) as their tokens are computed,
and states only at the boundaries vLLM offers (``boundary_state_offloads``, exact block
ids), of which few are kept (``checkpoints``: answers only while ``AnswerGate`` stores them;
admission's positions, the prompt's last boundary). The workers copy both out of the blocks in
``wait_for_save`` of the same step, so vLLM never has to hold blocks for a save, except for
one: the exact end-of-request state (``finish_tail``, Marconi's input+output checkpoint).
When a request of a recurrent model finishes at a position N inside a block, its state at N
sits in its Mamba block ``(N - 1) // block_size`` (align mode's running block), where vLLM's
``preprocess_mamba`` also reads a hit of N tokens from; KV of ``[.., N)`` and that state are
saved in the next step (vLLM keeps the blocks: ``request_finished`` returns True, the
workers report the request in ``finished_sending`` once copied), and a later request
sharing those N tokens hits at N exactly, not at the block below.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from hybrid_connector import assemble
from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.plan import MISS, LoadPlan, ObjectSpec
from hybrid_connector.integrations.vllm.checkpoints import (
    AnswerGate,
    PromptGate,
    never_wanted,
    save_cap,
    wanted_states,
)
from hybrid_connector.integrations.vllm.events import KvEvents
from hybrid_connector.integrations.vllm.junctions import offer_junction
from hybrid_connector.integrations.vllm.load_gate import gated
from hybrid_connector.integrations.vllm.meta import (
    Held,
    HybridConnectorMetadata,
    HybridWorkerMetadata,
    LoadJob,
    SaveJob,
    SaveObject,
)
from hybrid_connector.integrations.vllm.namespace import cacheable, lifter, owned
from hybrid_connector.integrations.vllm.setup import Groups
from hybrid_connector.integrations.vllm.stats import Counters
from hybrid_connector.integrations.vllm.tracked import Tracked
from hybrid_connector.runtime.progress import TokenBuffer
from hybrid_connector.runtime.ranks import RankGather
from hybrid_connector.runtime.session import cut_chunks
from hybrid_connector.tiers.configured import ledger_backend, shared_view

BlockIds = tuple[tuple[int, ...], ...]


class SchedulerSide:
    """The index side of the connector (see the module docstring); ``model_id``: the served
    weights (``geometry.weights``). Not thread safe: the engine-core thread only."""

    def __init__(self, config: HybridConfig, geometry: ModelGeometry, groups: Groups,
                 world_size: int, hash_block_size: int, layout: Mapping[str, object],
                 model_id: str = "") -> None:
        self.config = config
        self.groups = groups
        self.bs = groups.block_size
        self.hash_block = hash_block_size
        # recurrent hits land on saved states (block boundaries or an exact tail): any position
        self.hit_align = 1 if groups.recurrent else self.bs
        self.index: CacheIndex = assemble.index(config, geometry, ledger_backend(config),
                                                layout=dict(layout), model_id=model_id)
        self.gather = RankGather(self.index, world_size)
        self.index.shared_view = shared_view(config)  # type: ignore[assignment]
        self.stats = Counters()
        self._progress: dict[str, Tracked] = {}  # request id -> its progress
        self._loads: list[LoadJob] = []
        self._leases: dict[int, tuple[LoadPlan, Any]] = {}
        self._jobs = itertools.count(1)
        self._open: dict[int, set[int]] = {}  # ticket -> op indices not yet reported by all
        self._adopted = False
        self._finish_saves: list[SaveJob] = []  # end-of-request tails for the next step
        self._stale: set[ObjectKey] = set()  # in flight at a reset: cleared as they report
        self._recurrent = frozenset(groups.recurrent_groups)
        self._chunk, self._states = config.chunk_size, bool(groups.recurrent)  # per step
        self._kvb, self._sb = geometry.kv_bytes_per_token(), geometry.state_bytes()
        self.answers = AnswerGate(config.save_decode_cache, self.index)  # checkpoints.py
        self.prompts = PromptGate(self.bs)
        self.events: KvEvents | None = None  # vLLM's KV events, when enabled (events.py)
        self.saving = True  # False: vLLM's ``kv_role`` is ``kv_consumer`` (loads only)

    # ---------------------------------------------------------------- hits
    def tokens(self, request: Any) -> np.ndarray:
        """The request's tokens so far, lifted into its namespace (``namespace.py``; copied
        in once each, for a tracked request)."""
        rec = self._progress.get(request.request_id)
        buf = rec.tokens if rec is not None else TokenBuffer(lifter(request))
        return buf.view(request.all_token_ids, request.num_tokens)

    def sources_of(self, request_id: str) -> dict[Any, int] | None:
        """The external tokens of the request's last load, by the tier they came from."""
        rec = self._progress.get(request_id)
        return rec.sources if rec is not None else None

    def offers_of(self, request_id: str) -> Mapping[int, Mapping[int, int]]:
        """The state boundaries vLLM offered for the request: position -> group -> block."""
        rec = self._progress.get(request_id)
        return rec.offers if rec is not None else {}

    def match(self, request: Any, num_computed: int) -> tuple[int, bool]:
        """vLLM's ``get_num_new_matched_tokens``; remembers the plan for the allocation."""
        rid = request.request_id
        rec = self._progress.get(rid)
        if rec is None:
            if not cacheable(request):
                return 0, False  # prompt embeddings: never served, never saved
            rec = self._progress[rid] = Tracked(rid, tokens=TokenBuffer(lifter(request)))
        rec.request, rec.plan = request, None
        if num_computed % self.bs:
            return 0, False
        toks = rec.tokens.view(request.all_token_ids, request.num_tokens)
        if self.index.shared_view is not None and not rec.discovered:
            rec.discovered = True  # once per request: a lookup may be repeated
            self.index.discover(toks, rec.engine_hashes(self.hash_block, request.block_hashes, toks),
                                alignment=self.bs)
        # no hit past vLLM's own one (no junction there either) when the match stops short
        plan = self.index.lookup(toks, alignment=self.hit_align, replay=False, floor=num_computed)
        if plan.matched_tokens <= num_computed:
            return 0, False
        if self.groups.recurrent:  # a branch point inside its first chunk (junctions.py)
            offer_junction(self.index, request, toks, plan, num_computed, self.bs)
        plan = gated(self.index, self.config, toks, plan, num_computed, self.hit_align)  # load_gate
        if not plan.hit or not plan.exact or plan.num_tokens <= num_computed:
            return 0, False
        # every object it loads must carry the request's own key (namespace.py)
        if not owned(plan, rec.engine_hashes(self.hash_block, request.block_hashes, toks),
                     num_computed):
            self.stats.foreign_refused += 1
            return 0, False
        rec.plan, rec.plan_base = plan, num_computed
        return plan.num_tokens - num_computed, True

    def allocated(self, request: Any, block_ids: Callable[[], BlockIds], num_external: int) -> None:
        """vLLM's ``update_state_after_alloc``: lease the plan and queue its load
        (``block_ids``: the request's blocks, asked only for a load)."""
        rec = self._progress.get(request.request_id)
        plan = rec.plan if rec is not None else None
        if rec is None or plan is None:
            return
        rec.plan, local = None, rec.plan_base
        if num_external <= 0:
            return
        end = local + num_external
        toks = self.tokens(request)
        if end != plan.num_tokens:  # vLLM took less: the state must sit exactly at end
            plan = self.index.lookup_at(toks, end, alignment=self.hit_align) \
                if end % self.hit_align == 0 else plan
            hashes = rec.engine_hashes(self.hash_block, request.block_hashes, toks)
            plan = plan if owned(plan, hashes, local) else MISS  # MISS: vLLM recomputes
        lease = self.index.acquire(plan) if plan.num_tokens == end else None
        self.index.record_lookup(plan)
        job = next(self._jobs)
        # only what vLLM lacks is read: KV chunks wholly below its local hit are skipped
        objs = tuple(o for o in (plan.objects if lease is not None else ())
                     if o.ref.key.kind is not ObjectKind.KV or o.ref.key.end > local)
        self._loads.append(LoadJob(
            request.request_id, job, local, end, tuple(o.ref.key for o in objs),
            tuple(o.tier for o in objs), tuple(o.ref.nbytes for o in objs), block_ids()))
        self._leases[job] = (plan, lease)
        rec.sources = self.stats.loaded(objs, plan, local, end,
                                        lease is not None and bool(self.groups.recurrent))

    # ---------------------------------------------------------------- saves
    def _admitted_states(self, rec: Tracked, toks: np.ndarray, upto: int, cap: int) -> list[int]:
        """Offered boundaries (every recurrent group's block known) up to ``upto`` that are
        not saved yet and worth a state (``checkpoints.wanted_states``); offers no later
        step can want are closed."""
        n_groups = len(self._recurrent)
        full = [q for q in rec.open_offers if 0 < q <= upto and len(rec.offers[q]) == n_groups]
        if not full:
            return []
        prompt, answers = rec.request.num_prompt_tokens, self.answers.stores(rec.request)
        want = wanted_states(self.index, toks, cap, prompt, self.bs, answers, full) \
            if min(full) <= prompt else set()  # every wanted position lies in the prompt
        got = sorted(q for q in full if q in want)
        rec.open_offers.difference_update(never_wanted(full, upto, prompt, answers))
        return got

    def _nothing_new(self, rec: Tracked, upto: int) -> bool:
        """Saving ``rec``'s first ``upto`` tokens adds no state boundary and no KV chunk."""
        return not (self._states and rec.open_offers) and (
            not self._kvb or upto - upto % self._chunk <= rec.kv_saved)

    def saves_for(self, rec: Tracked, end: int,
                  block_ids: Callable[[], Sequence[Sequence[int]] | None]) -> SaveJob | None:
        """The save job for ``rec``'s request once its first ``end`` tokens are computed;
        ``block_ids`` gives its blocks per group (asked only when there is something to
        save; None: vLLM no longer knows the request, nothing is saved). ``build_meta``
        skips the call once the gates decided and nothing can be saved (cap <= end)."""
        request, chunk, kv_from, kvb = rec.request, self._chunk, rec.kv_saved, self._kvb
        unsaved = bool(self._states and rec.open_offers)
        cap, rec.gated = save_cap(self.answers, self.prompts, request, end, rec.tokens), True
        if self._nothing_new(rec, cap):
            return None  # most decode steps: no new chunk, no new boundary (skip the O(n) work)
        toks = rec.tokens.view(request.all_token_ids, request.num_tokens)[:end]
        states = self._admitted_states(rec, toks, end, cap) if unsaved else []
        kv_to = max([cap - cap % chunk, *states])
        specs: list[ObjectSpec] = []
        if kv_to > kv_from and kvb:  # a state-only model (pure SSM) saves no KV
            specs += [ObjectSpec(ObjectKind.KV, s, e, (e - s) * kvb)
                      for s, e in cut_chunks(kv_from, kv_to, chunk, states)]
        sb = self._sb
        specs += [ObjectSpec(ObjectKind.STATE, q, q, sb) for q in states if q >= kv_from]
        ids = block_ids() if specs else None
        if ids is None:
            return None
        rec.kv_saved = max(kv_from, kv_to)
        rec.saved_states(states)
        return self._job(rec, toks, specs, tuple(tuple(x) for x in ids),
                         {q: dict(rec.offers[q]) for q in states})

    def _job(self, rec: Tracked, toks: np.ndarray, specs: list[ObjectSpec], block_ids: BlockIds,
             state_blocks: Mapping[int, Mapping[int, int]]) -> SaveJob | None:
        """Begin saving ``specs`` (a state at q copied from ``state_blocks[q]``: group ->
        block); None when the index wants none of them."""
        hashes = rec.engine_hashes(self.hash_block, rec.request.block_hashes, toks)
        # the radix walk resumes where the request's last save ended (its tokens only grow)
        ticket = self.index.begin_save(toks, specs, hashes=hashes, start=rec.leaf)
        rec.leaf = ticket.leaf
        objects = []
        for key, sp in zip(ticket.keys, specs, strict=True):
            if key is None:
                continue
            blocks = tuple(state_blocks[sp.end].items()) if sp.kind is ObjectKind.STATE else ()
            objects.append(SaveObject(key, sp.kind, sp.start, sp.end, blocks))
            self.stats.saved_objects[sp.kind.value] += 1
        if self.events is not None:
            self.events.describe(rec.request, objects)
        if not ticket.ops:
            self.gather.forget_ticket(ticket.id)
            return None
        self._open[ticket.id] = set(range(len(ticket.ops)))
        return SaveJob(rec.request_id, self.gather.expect(ticket), tuple(objects), block_ids)

    def partial_tail(self, request: Any, offloads: list[tuple[int, int, int]]) -> None:
        """vLLM's ``register_finished_partial_tail``: the exact blocks holding the state at
        the request's last computed token (its own bookkeeping, when it keyed a partial
        tail there); ``finish_tail`` copies the state from them."""
        n, rec = request.num_computed_tokens, self._progress.get(request.request_id)
        got = {int(g): int(b) for g, b, q in offloads if q == n and g in self._recurrent}
        if got and rec is not None:
            rec.tail_blocks = got

    def finish_tail(self, request: Any, block_ids: BlockIds) -> bool:
        """Queue the save of the exact end-of-request state (module docstring) and the KV
        below it; True when one was queued (vLLM must keep the blocks until the workers
        report the request in ``finished_sending``). Nothing for a model without recurrent
        groups, a request preempted to zero, a tail already saved (a boundary offer), and
        generated tokens unless ``save_decode_cache``. A tail on a block boundary sits in
        that boundary's block, the same ``(N - 1) // block_size``. Under vLLM's async
        scheduling a request that stopped at step t has step t+1 in flight, computing its
        last token (the stop token): the tail is taken after it, at ``num_computed_tokens``,
        and copied in a step after that one. More than one token in flight (speculative
        drafts, a prefill chunk), or one whose token is not known yet: no tail."""
        rec = self._progress.get(request.request_id)
        if rec is None or not self.saving:
            return False
        n = request.num_computed_tokens
        vllm_blocks, rec.tail_blocks = rec.tail_blocks, None
        cap = save_cap(self.answers, self.prompts, request, n, rec.tokens)
        if (not self.groups.recurrent or n <= 0 or cap != n or request.num_in_flight_tokens > 1
                or n > request.num_tokens or n in rec.states_saved):
            return False
        idx = (n - 1) // self.bs
        blocks = vllm_blocks or {g: block_ids[g][idx] for g in self.groups.recurrent_groups
                                 if idx < len(block_ids[g]) and block_ids[g][idx]}
        if len(blocks) != len(self.groups.recurrent_groups):
            return False  # a block already gone (null): nothing exact to copy
        toks = rec.tokens.view(request.all_token_ids, request.num_tokens)[:n]
        kv_from, kvb = rec.kv_saved, self._kvb
        specs: list[ObjectSpec] = []
        if kvb and n > kv_from:
            specs += [ObjectSpec(ObjectKind.KV, s, e, (e - s) * kvb)
                      for s, e in cut_chunks(kv_from, n, self.config.chunk_size)]
        specs.append(ObjectSpec(ObjectKind.STATE, n, n, self._sb))
        job = self._job(rec, toks, specs, block_ids, {n: blocks})
        if job is None:
            return False
        self._finish_saves.append(job)
        return True

    def build_meta(self, scheduler_output: Any) -> HybridConnectorMetadata:
        """vLLM's ``build_connector_meta``: this step's loads, saves and pending ops."""
        meta = HybridConnectorMetadata(loads=self._loads, saves=self._finish_saves,
                                       hold=[j.req_id for j in self._finish_saves])
        self._loads, self._finish_saves = [], []
        bstate = scheduler_output.kv_connector_block_state
        for rid, offers in (bstate.boundary_state_offloads if bstate else {}).items():
            rec = self._progress.get(rid)
            if rec is None:
                continue  # not a request the connector was asked about: nothing to save
            for g, block_id, q in offers:
                q = int(q)
                rec.offers.setdefault(q, {})[int(g)] = int(block_id)
                if q not in rec.states_saved:
                    rec.open_offers.add(q)
        for rid, n in scheduler_output.num_scheduled_tokens.items() \
                if bstate is not None and self.saving else ():
            rec = self._progress.get(rid)
            if rec is None:
                continue
            # a token sampled in a step still in flight (vLLM's async scheduling) is not
            # known yet: KV up to it is saved in a later step (its blocks stay: running)
            end = min(rec.request.num_computed_tokens + n, rec.request.num_tokens)
            if rec.gated and self._nothing_new(rec, end):  # the cap is at most ``end``
                continue
            # block ids are copied only for a step that saves something
            job = self.saves_for(rec, end, partial(bstate.get_block_ids, rid))
            if job is not None:
                meta.saves.append(job)
        drained = self.gather.drained()
        if drained is not None:
            self._open[drained.ticket] = set(range(len(drained.ops)))
            meta.ops.append(drained)
        return meta

    # ---------------------------------------------------------------- reports
    def reports(self, meta: HybridWorkerMetadata | None) -> None:
        """vLLM's ``update_connector_output``: apply the ranks' reports to the index."""
        if meta is None:
            return
        if meta.inventory:
            self._adopt(meta.inventory)
        for rep in meta.op_reports:
            if self.gather.op_report(rep):
                left = self._open.get(rep.ticket)
                if left is not None:
                    left.difference_update(rep.indices)
                    if not left:
                        del self._open[rep.ticket]
                        self.gather.forget_ticket(rep.ticket)
        self._stale = self.index.clear(self._stale) if self._stale else self._stale
        for job, load in meta.load_reports:
            entry = self._leases.get(job)
            if entry is None:
                continue
            plan, lease = entry
            failed = self.gather.load_report(plan, load) if lease is not None else ()
            if failed is None:
                continue  # other ranks still to report
            del self._leases[job]
            if lease is not None:
                self.index.release(lease)
            self.stats.reported(not failed and lease is not None, plan.num_tokens)

    def _adopt(self, inventory: list[tuple[int, list[Held]]]) -> None:
        """Each rank's first report: what its NVMe tier kept (``RankGather.inventory``
        adopts what every rank holds once all reported, and removes the rest)."""
        for rank, items in inventory:
            # vLLM's block hashes cannot be recomputed here (extra keys, its hash function):
            # the chain is trusted to the NVMe tier's checksums, as rebuild.py documents
            got = None if self._adopted else self.gather.inventory(rank, items, verify=False)
            if got is not None:
                self.stats.restored, self._adopted = dict(got.indexed), True

    def finished(self, request: Any, block_ids: BlockIds = ()) -> bool:
        """vLLM's ``request_finished``: queue its end-of-request tail (``finish_tail``), then
        forget the request (its other saves are copied already). True: keep its blocks."""
        rec = self._progress.get(request.request_id)
        if rec is None and not cacheable(request):
            return False  # never tracked (prompt embeddings)
        held, toks = self.finish_tail(request, block_ids) if block_ids else False, self.tokens(request)
        self._progress.pop(request.request_id, None)
        self.answers.finished(request, toks)
        self.prompts.finished(request)
        self.index.finish(toks, request.num_prompt_tokens, start=rec.leaf if rec else None)
        return held

    def reset(self) -> bool:
        """vLLM's ``reset_cache`` (weights updated): forget every stored object (puts in
        flight as they report), stop saving running requests (stale KV), key new saves
        under a new epoch (``CacheIndex.clear``)."""
        self._stale |= self.index.clear(new_epoch=True)
        self._progress.clear()
        return True

    def close(self) -> None:
        self.index.close()
        if self.index.shared_view is not None:
            self.index.shared_view.close()  # type: ignore[attr-defined]
