"""``CacheAPI``: the request verbs an engine drives, and their contracts, written once.

Two classes implement it and declare so: ``HybridCache`` (embedded: the index and the
bytes in this process) and ``ServerCache`` (server mode: both in a cache server, shared by
every engine of the model). ``RequestSession`` and the integrations that take a cache take a
``CacheAPI``, so either serves them. One request, in order::

    found = cache.discover(prompt)           # what other instances put on a shared tier
    plan = cache.lookup(prompt)              # the hit, no side effects
    cache.record_lookup(plan)                # count it (statistics, eviction's recency)
    saves = cache.plan_saves(prompt)         # where admission wants checkpoints
    lease = cache.acquire(plan)              # lock what will be loaded
    loaded = cache.load(plan)                # the payloads (never raises for store failures)
    cache.release(lease)                     # once the engine holds them
    cache.save_async(tokens, items)          # KV chunks, checkpoints, anchors as produced
    cache.finish(all_tokens, items)          # the last objects, then forget the request

**The hit rule** holds for every plan either returns: a hit of p tokens has KV for every
attention layer over ``[0, p)`` and a recurrent state at exactly p (a checkpoint, or anchors
covering the replay window, labelled approximate), p below the prompt's length and a
multiple of the alignment.

What differs between the two (timeouts, whose statistics, where leases live) is written in
``ServerCache``'s module docstring; every method here is safe from any thread in both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Protocol

import numpy as np

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.hashes import Hashes
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.discovery import Found
from hybrid_connector.index.plan import LoadPlan, LoadResult, SaveItem, SaveResult
from hybrid_connector.index.state import Lease
from hybrid_connector.policies.base import SavePlan

Tokens = Sequence[int] | np.ndarray


class CacheAPI(Protocol):
    """The verbs of the module docstring. ``alignment`` arguments default to the config's
    and must be positive multiples of its hash block (ValueError otherwise)."""

    @property
    def config(self) -> HybridConfig:
        """The configuration the cache was built with (chunk size, alignment, replay)."""
        ...

    @property
    def geometry(self) -> ModelGeometry:
        """The model's layers as the cache sizes objects for them."""
        ...

    def expected_nbytes(self, kind: ObjectKind, start: int, end: int) -> int:
        """Payload bytes the geometry gives an object of ``kind`` over ``[start, end)``:
        what ``save`` checks an item's payload against."""
        ...

    # ---------------------------------------------------------------- lookups
    def discover(self, tokens: Tokens, hashes: Hashes | None = None,
                 alignment: int | None = None) -> Found:
        """Index what other instances stored for ``tokens`` on a shared tier (nothing
        without one); ``hashes``: the prompt's prefix hashes, computed when None."""
        ...

    def lookup(self, tokens: Tokens, alignment: int | None = None,
               replay: bool | None = None) -> LoadPlan:
        """The longest hit for ``tokens`` under the hit rule, without side effects;
        ``replay`` (default the config's) allows approximate hits over anchors."""
        ...

    def lookup_at(self, tokens: Tokens, p: int, alignment: int | None = None) -> LoadPlan:
        """A plan for a hit of exactly ``p`` tokens (KV over ``[0, p)``, the exact state at
        p), or a miss (also when ``p`` is not below the prompt's length). Pure. ValueError
        when ``p`` is negative or not a multiple of the alignment."""
        ...

    def record_lookup(self, plan: LoadPlan) -> None:
        """Count a lookup the engine acted on in the statistics (apart from ``lookup``,
        which stays pure)."""
        ...

    def plan_saves(self, tokens: Tokens, alignment: int | None = None) -> SavePlan:
        """Where admission wants checkpoints while ``tokens`` (a prompt) is prefilled, and
        the first KV chunk the cache lacks. No side effects."""
        ...

    def final_checkpoint(self, num_tokens: int, alignment: int | None = None) -> int:
        """Where a request of ``num_tokens`` tokens must take its end-of-request state to
        be usable: the last aligned position at or before it."""
        ...

    # ---------------------------------------------------------------- leases
    def acquire(self, plan: LoadPlan) -> Lease | None:
        """Lock the plan's objects against eviction until ``release``; None when the plan
        went stale (an object left since the lookup): treat it as a miss."""
        ...

    def release(self, lease: Lease | None) -> None:
        """Unlock a lease (None: nothing). Each lease is released once."""
        ...

    # ---------------------------------------------------------------- loads
    def load(self, plan: LoadPlan) -> LoadResult:
        """Read the plan's payloads; never raises for store failures: a failed object is
        in ``failed`` and the hit shrinks to what stays usable (nothing, with recurrent
        layers). The plan should be ``acquire``-d first."""
        ...

    def load_async(self, plan: LoadPlan) -> Future[LoadResult]:
        """``load`` on a background thread, so slow tiers overlap engine work."""
        ...

    # ---------------------------------------------------------------- saves
    def save_async(self, tokens: Tokens, items: Iterable[SaveItem], hashes: Hashes | None = None,
                   start: tuple[int, int] | None = None) -> Future[SaveResult]:
        """Store objects produced for ``tokens`` (covering every item's end); returns at
        once, the payloads belong to the cache until the future is done. Rejected items
        are counted and listed in the result, never raised; ValueError only for malformed
        items. ``hashes``/``start``: the request's prefix hashes and its previous save's
        ``SaveResult.leaf``, if the caller keeps them."""
        ...

    def save(self, tokens: Tokens, items: Iterable[SaveItem], hashes: Hashes | None = None,
             start: tuple[int, int] | None = None) -> SaveResult:
        """``save_async`` waited on."""
        ...

    def finish(self, tokens: Tokens, items: Iterable[SaveItem] = (),
               prompt_len: int | None = None, hashes: Hashes | None = None,
               start: tuple[int, int] | None = None) -> SaveResult:
        """End of a request: save its last objects (the final checkpoint only if admission
        keeps it), release what can no longer produce a hit, and tell eviction about the
        request (``prompt_len``: how many of ``tokens`` were the prompt, default all).
        ValueError for ``prompt_len`` outside ``[0, len(tokens)]``."""
        ...

    # ---------------------------------------------------------------- upkeep
    def flush(self) -> None:
        """Wait until every save queued so far has reached its tier."""
        ...

    def check_integrity(self) -> None:
        """Check the index and the store's accounting agree (after ``flush``); raises
        when they do not."""
        ...

    def close(self) -> None:
        """Wait for in-flight loads and saves, then release everything held."""
        ...
