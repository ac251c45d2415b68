"""One request's life against a cache, written once: the demo, the simulator, the
transformers runtime and the engine integrations all drive requests through it.

::

    s = RequestSession(cache, prompt)       # lookup (+ replay gate), save plan
    loaded = s.load()                       # acquire + read; s.hit is the usable prefix
    ... restore, run prompt[s.hit:], taking states at s.checkpoints ...
    s.release()                             # once the loaded objects are in the engine
    s.save_prefill(kv, states)              # KV chunks cut at checkpoints, checkpoints
    s.extend(output_tokens)                 # decode
    s.finish(kv, states)                    # the rest of the KV, the final checkpoint

What an engine can produce is respected: checkpoints only past the hit (the engine holds
the state at p and computes onwards), KV chunks from the first chunk the cache lacks, cut
at multiples of ``chunk_size`` and at every checkpoint (so each checkpoint has KV ending
exactly at it), the tail after the last cut saved at finish, cut at the final checkpoint.
Saves are keyed by the request's ``ChainHasher``, so each costs O(new tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from hybrid_connector.core.hashes import ChainHasher
from hybrid_connector.core.keys import ObjectKind, PrefixHasher, as_tokens
from hybrid_connector.index.plan import LoadPlan, LoadResult, SaveItem, SaveResult
from hybrid_connector.index.state import Lease
from hybrid_connector.runtime.api import CacheAPI
from hybrid_connector.runtime.progress import RequestProgress

KVFn = Callable[[int, int], torch.Tensor]  # payload of the KV chunk [start, end)
Gate = Callable[[LoadPlan], bool]  # may an approximate (replay) plan be used?


def cut_chunks(start: int, end: int, chunk: int, cuts: Iterable[int] = (),
               tail: bool = True) -> list[tuple[int, int]]:
    """``[start, end)`` cut at multiples of ``chunk`` and at every cut inside it, as
    consecutive ranges; with ``tail`` False the piece after the last cut is left out."""
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    bounds = {b for b in range(start - start % chunk + chunk, end + 1, chunk)}
    bounds |= {c for c in cuts if start < c <= end}
    if tail and end > start:
        bounds.add(end)
    out, prev = [], start
    for b in sorted(bounds):
        out.append((prev, b))
        prev = b
    return out


class RequestSession:
    """One request (see the module docstring). ``alignment``: the engine's hit
    granularity (default the config's); ``gate`` decides whether an approximate plan may be
    used (without one, approximate plans are used only when replay is on); ``record``:
    count the lookup in the cache's statistics; ``ahead``: prefix hashes of the prompt and
    output this request will hold, computed once for several caches serving it (the tuner's
    twins; used only where the tokens match, see ``ChainHasher``). Where the request stands (plan, lease,
    what was loaded, the hit, what is saved) is its ``progress`` record, the one the vLLM
    connector keeps per request too. Not thread safe."""

    def __init__(self, cache: CacheAPI, prompt: Sequence[int] | np.ndarray, *,
                 alignment: int | None = None, replay: bool | None = None,
                 gate: Gate | None = None, record: bool = True,
                 ahead: PrefixHasher | None = None) -> None:
        self.cache = cache
        self.prompt = as_tokens(prompt)
        self.n = int(self.prompt.size)
        self.alignment = alignment
        self.hasher = ChainHasher(cache.config.hash_block_size, self.prompt, ahead)
        self._extra: list[int] = []
        self.gate_rejected = False
        # What other instances stored on a shared tier becomes known before the lookup.
        self.found = cache.discover(self.prompt, self.hasher, alignment)
        plan = cache.lookup(self.prompt, alignment, replay)
        if plan.hit and not plan.exact and gate is not None and not gate(plan):
            self.gate_rejected = True
            plan = cache.lookup(self.prompt, alignment, replay=False)
        if record:
            cache.record_lookup(plan)
        self.saves = cache.plan_saves(self.prompt, alignment)
        self.progress = RequestProgress(plan=plan, kv_saved=self.saves.kv_from)
        # Tokens another request already brought (cached KV, or up to the branch point):
        # with ``anchor_admission: shared`` only anchor pages inside them are saved.
        self.shared = max(self.saves.kv_from, self.saves.branch_point or 0)

    # ------------------------------------------------------------------ progress
    @property
    def plan(self) -> LoadPlan:
        """The load planned at construction (a miss when nothing usable was found)."""
        assert self.progress.plan is not None
        return self.progress.plan

    @property
    def lease(self) -> Lease | None:
        """The cache's lock on what ``load`` read, until ``release``."""
        return self.progress.lease

    @lease.setter
    def lease(self, lease: Lease | None) -> None:  # an engine that leases by itself
        self.progress.lease = lease

    @property
    def loaded(self) -> LoadResult | None:
        """What ``load`` returned (None before it ran)."""
        return self.progress.loaded

    @property
    def hit(self) -> int:
        """The usable prefix ``load`` gave (0 before it ran)."""
        return self.progress.hit

    @hit.setter
    def hit(self, n: int) -> None:  # an engine that loads by itself
        self.progress.hit = n

    @property
    def kv_done(self) -> int:
        """First token whose KV is not saved yet."""
        return self.progress.kv_saved

    # ------------------------------------------------------------------ load
    def load(self) -> LoadResult:
        """Lock and read the plan (a miss or a stale plan gives ``LoadResult(0)``); the
        lease is held until ``release`` (or ``finish``)."""
        p = self.progress
        if self.plan.hit and p.lease is None:
            p.lease = self.cache.acquire(self.plan)
        loaded = LoadResult(0, True) if p.lease is None else self.cache.load(self.plan)
        p.loaded, p.hit = loaded, loaded.num_tokens
        return loaded

    def release(self) -> None:
        """Unlock what ``load`` read (idempotent)."""
        lease, self.progress.lease = self.progress.lease, None
        self.cache.release(lease)

    @property
    def checkpoints(self) -> tuple[int, ...]:
        """Checkpoint positions admission wants that the engine can still take: past the
        hit, before the last prompt token."""
        return tuple(q for q in self.saves.state_positions if self.hit < q < self.n)

    # ------------------------------------------------------------------ saves
    @property
    def tokens(self) -> np.ndarray:
        """Prompt plus every token ``extend`` added."""
        return self.hasher.tokens

    def prefill_items(self, kv: KVFn | None, states: Mapping[int, torch.Tensor],
                      extra: Iterable[SaveItem] = ()) -> list[SaveItem]:
        """Items for what the prefill computed: KV chunks from the first missing chunk to
        the last cut inside the prompt (a multiple of the chunk size or a checkpoint), the
        checkpoints in ``states``, and ``extra`` (anchor pages). Advances ``kv_done``."""
        p = self.progress
        cuts = [q for q in states if p.kv_saved < q <= self.n]
        ranges = cut_chunks(p.kv_saved, self.n, self.cache.config.chunk_size, cuts, tail=False)
        items = [SaveItem(ObjectKind.KV, s, e, kv(s, e)) for s, e in ranges] if kv else []
        if ranges:
            p.kv_saved = ranges[-1][1]
        items += [SaveItem(ObjectKind.STATE, q, q, t) for q, t in sorted(states.items())]
        return [*items, *self._admit_anchors(extra)]

    def _admit_anchors(self, extra: Iterable[SaveItem]) -> list[SaveItem]:
        """``extra`` less the anchor pages ``anchor_admission: shared`` refuses: Marconi's
        admission rule applied to anchors (reuse is predicted where a prefix was already
        shared; a prefix seen once, the common case, gets none)."""
        if self.cache.config.anchor_admission == "all":
            return list(extra)
        return [it for it in extra if it.kind is not ObjectKind.ANCHOR or it.end <= self.shared]

    def save_prefill(self, kv: KVFn | None, states: Mapping[int, torch.Tensor],
                     extra: Iterable[SaveItem] = ()) -> SaveResult:
        """Save ``prefill_items`` (waits for the tiers; see ``HybridCache.save``)."""
        items = self.prefill_items(kv, states, extra)
        if not items:
            return SaveResult(0, 0, 0)
        result = self.cache.save(self.prompt, items, hashes=self.hasher, start=self.progress.leaf)
        self.progress.leaf = result.leaf
        self.progress.states_saved.update(q for q in states)
        return result

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Tokens the engine decoded (they become part of the saved prefix at finish)."""
        self.hasher.append(tokens)

    def finish(self, kv: KVFn | None, states: Mapping[int, torch.Tensor],
               extra: Iterable[SaveItem] = ()) -> SaveResult:
        """End the request: the KV not saved yet, cut at the final checkpoint, the states
        the engine hands over (the final one kept only if admission wants it) and
        ``extra``; then release the lease and let the cache drop dead KV."""
        self.release()
        m = len(self.hasher)
        final = self.cache.final_checkpoint(m, self.alignment)
        p = self.progress
        ranges = cut_chunks(p.kv_saved, m, self.cache.config.chunk_size, [final])
        items = [SaveItem(ObjectKind.KV, s, e, kv(s, e)) for s, e in ranges] if kv else []
        p.kv_saved = m
        items += [SaveItem(ObjectKind.STATE, q, q, t) for q, t in sorted(states.items())]
        items += self._admit_anchors(extra)
        p.states_saved.update(states)
        return self.cache.finish(self.tokens, items, prompt_len=self.n, hashes=self.hasher,
                                 start=p.leaf)

    def __enter__(self) -> RequestSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
