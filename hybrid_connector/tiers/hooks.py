"""``StoreHooks``: what an index tells a store it shares (the callbacks a store's ledger
half routes by model fingerprint, see ``hybrid_connector.tiers.backend.Backend.attach``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.tiers.ledger.value import ValueFn

DropListener = Callable[[Sequence[ObjectKey]], None]
DemotionFilter = Callable[[ObjectKey], bool]
CompanionFn = Callable[[ObjectKey], Sequence[ObjectKey]]


@dataclass(frozen=True)
class StoreHooks:
    """What an index tells a store it shares.

    ``on_drop(keys)``: the store dropped these keys on its own (called without the store's
    lock; it may call back into the store). ``merits_demotion(key)``: whether an evicted
    object deserves a slower tier (no hook: yes). ``companions(kv_key)``: anchor keys that
    die with that KV chunk. ``tier_value(key, nbytes, tier, hits, age)``: the key's value per
    byte in a tier for ``tier_eviction: value`` (``hybrid_connector.tiers.ledger.value``; no
    hook: unknown, LRU rules). The last three are called with the store's lock held: they
    must not block on other locks.
    """

    on_drop: DropListener | None = None
    merits_demotion: DemotionFilter | None = None
    companions: CompanionFn | None = None
    tier_value: ValueFn | None = None
