"""Value-ranked eviction across tiers for the ledger (``tier_eviction: value``).

The ledger stays metadata-only and engine-neutral: what an object is worth comes from an
injected ``ValueFn`` (implemented by the policy ``hybrid_connector.policies.eviction.tier_value.TierValue``,
handed over by the index's store hooks), asked with
what the ledger itself tracks of the object: its size, the tier in question, how many
times it was used (``Entry.hits``, one per ``touch``) and how long ago (``age``: ledger
clock ticks since it was placed, last touched or moved down into its tier, the recency of
the tier's LRU order; one tick per ``place`` and per ``touch``). Its answer is the seconds
one future hit of the object saves when served from that tier (recompute time minus the
tier's read time), times the hit likelihood, per byte; ``None``: unknown (a key of an
index without the hook), and the LRU rules apply to it.

With a window ``w > 0`` set on the ledger:

* victim: among the ``w`` least recently used candidates of the full pool (ready, unpinned,
  not excluded), the one losing the least value per byte by leaving: its value in that
  tier minus what it keeps in the next local tier down (its value there when positive;
  at the bottom, its whole value). Ties and unknowns: the least recently used. A bounded
  scan: ``w`` candidates scored per eviction (two value calls each), never all N; like
  the LRU victim search it steps over pinned, pending and other pools' keys.
* destination: the next slower local tier only where the object's value is positive
  (loading it from there beats recomputing it); else it leaves the local tiers, kept as a
  shared-only copy only where its value on the shared tier is positive too.

``w = 0`` (the default) is the LRU ledger, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ledger.records import Entry, TierUsage


class ValueFn(Protocol):
    """What the ledger asks of an object's worth: the value per byte of ``key`` served from
    ``tier`` (see the module docstring). The ledger's side of the contract only; the
    policy that computes it is ``hybrid_connector.policies.eviction.tier_value.TierValue``."""

    def __call__(self, key: ObjectKey, nbytes: int, tier: str, hits: int,
                 age: int) -> float | None: ...


def value_of(fn: ValueFn, e: Entry, tier: str, clock: int) -> float | None:
    return fn(e.key, e.nbytes, tier, e.hits, max(0, clock - e.last))


def loss(fn: ValueFn, e: Entry, tier: str, below: str | None, clock: int) -> float | None:
    """Value per byte lost when ``e`` leaves ``tier``: its value there minus what it keeps
    one tier ``below`` (when positive there; None: the bottom)."""
    here = value_of(fn, e, tier, clock)
    if here is None or below is None:
        return here
    there = value_of(fn, e, below, clock)
    return here - max(0.0, there) if there is not None else None


def lowest_value(t: TierUsage, entries: Mapping[ObjectKey, Entry], pool: str | None,
                 exclude: set[ObjectKey], fn: ValueFn, clock: int, window: int,
                 local: Sequence[TierUsage] = ()) -> ObjectKey | None:
    """The victim of ``t``'s ``pool``: the least value lost (``loss``, below: the next of
    the ``local`` tiers with a pool of the kind) among the first ``window`` eligible keys
    in LRU order (see the module docstring); None when nothing is eligible."""
    at = next((i for i, u in enumerate(local) if u is t), len(local))
    after = local[at + 1:]
    kind_pool, name = t.spec.kind_pool, t.spec.name
    below: dict[ObjectKind, str | None] = {}  # kind -> the next local tier holding it
    best: ObjectKey | None = None
    best_v = 0.0
    seen = 0
    for k in t.lru:
        e = entries[k]
        if kind_pool.get(k.kind) != pool or e.pending or e.pins or k in exclude:
            continue
        if k.kind not in below:
            below[k.kind] = next((u.spec.name for u in after if k.kind in u.spec.kind_pool), None)
        v = loss(fn, e, name, below[k.kind], clock)
        if best is None or (v is not None and v < best_v):
            best, best_v = k, (v if v is not None else float("inf"))
        seen += 1
        if seen >= window:
            break
    return best


def worth_keeping(fn: ValueFn | None, window: int, e: Entry, tier: str, clock: int) -> bool:
    """Whether ``e`` is worth a copy in ``tier``: always without a value function or
    with window 0 (LRU); else when its value there is positive (or unknown)."""
    if fn is None or not window:
        return True
    v = value_of(fn, e, tier, clock)
    return v is None or v > 0.0
