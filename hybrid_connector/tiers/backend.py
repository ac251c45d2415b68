"""``Backend``: the ledger half of a store, what an index stores through. A ledger (what is
where, budgets), the lock that guards it, the hooks of every index attached to it, and the
executor of this process's tiers when the bytes live here. With the bytes here, a store is
an ``ObjectStore`` (``hybrid_connector.tiers.store``, built as a ``TieredStore``), which adds
the object calls; a bare ``Backend`` (no executor) is what a process whose bytes live
elsewhere holds (a vLLM scheduler, whose bytes are in its TP workers): the owner ships the
ops there.

Several indexes (models) may share one backend: each attaches ``StoreHooks`` under its
model fingerprint and is told only about its own keys. Lock order: an index's lock, then
the backend's lock, never the reverse; drops are reported with the backend lock released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.tiers.executor import Executor
from hybrid_connector.tiers.hooks import CompanionFn, DemotionFilter, DropListener, StoreHooks
from hybrid_connector.tiers.ledger.ledger import Ledger, TierSpec
from hybrid_connector.tiers.tier import Tier


def spec_of(tier: Tier) -> TierSpec:
    """The ledger's view of a tier: its per-kind budgets (one pool for the kinds that share
    a budget, ``tier.joint``), whether reads are slow
    (``tier.slow``), whether it is shared with other instances (``tier.shared``) and the
    allocation granularity of its pools (``tier.granularity``; defaults False, False, 1)."""
    from hybrid_connector.core.keys import ObjectKind

    budgets = {k: tier.capacity(k) for k in ObjectKind}
    return TierSpec.per_kind(tier.name, budgets, slow=bool(getattr(tier, "slow", False)),
                             shared=bool(getattr(tier, "shared", False)),
                             grains={k: tier.granularity(k) for k in ObjectKind},
                             joint=getattr(tier, "joint", ()))


class Backend:
    """A ledger over ``specs`` (fastest first) plus an optional local ``executor`` (a store
    with its bytes here is an ``ObjectStore``; see the module docstring).
    ``keeps_meta``: whether saves must hand each object its ``ObjectMeta`` (False for a
    backend that keeps no bytes, such as the simulator's: building metadata is then skipped)."""

    keeps_meta = True

    def __init__(self, specs: Sequence[TierSpec], executor: Executor | None = None) -> None:
        self.hooks: dict[str | None, StoreHooks] = {None: StoreHooks()}
        self.ledger = Ledger(specs, merits=self._merits, value=self._value)
        # One lock: the ledger's own (it takes it in every call); the backend's own sequences
        # of ledger calls and its hooks hold it too.
        self.lock = self.ledger.lock
        self.executor = executor

    # ------------------------------------------------------------------ hooks
    def attach(self, fingerprint: str, hooks: StoreHooks) -> None:
        """Route callbacks for ``fingerprint``'s keys to ``hooks``. Raises ValueError when an
        index of that fingerprint is attached already (two indexes of one model on one
        backend would each see the other's objects as unknown)."""
        with self.lock:
            if fingerprint in self.hooks:
                raise ValueError(f"an index for model fingerprint {fingerprint} is already "
                                 "attached to this store")
            self.hooks[fingerprint] = hooks

    def detach(self, fingerprint: str) -> None:
        with self.lock:
            self.hooks.pop(fingerprint, None)

    def _set_default(self, **fields: Any) -> None:
        with self.lock:
            self.hooks[None] = replace(self.hooks[None], **fields)

    def set_drop_listener(self, listener: DropListener | None) -> None:
        """Default drop listener, for keys whose fingerprint has no hooks attached."""
        self._set_default(on_drop=listener)

    def set_demotion_filter(self, merits: DemotionFilter | None) -> None:
        """Default demotion filter, for keys whose fingerprint has no hooks attached."""
        self._set_default(merits_demotion=merits)

    def set_companions(self, companions: CompanionFn | None) -> None:
        """Default companions function, for keys whose fingerprint has no hooks attached."""
        self._set_default(companions=companions)

    def hooks_of(self, key: ObjectKey) -> StoreHooks:
        return self.hooks.get(key.fingerprint) or self.hooks[None]

    def _merits(self, key: ObjectKey) -> bool:
        merits = self.hooks_of(key).merits_demotion
        return merits is None or merits(key)

    def _value(self, key: ObjectKey, nbytes: int, tier: str, hits: int, age: int) -> float | None:
        fn = self.hooks_of(key).tier_value
        return None if fn is None else fn(key, nbytes, tier, hits, age)

    def report_dropped(self, keys: Sequence[ObjectKey]) -> None:
        """Tell each key's owner about keys that left every tier (call with no lock held)."""
        by_owner: dict[int, tuple[DropListener, list[ObjectKey]]] = {}
        for k in keys:
            listener = self.hooks_of(k).on_drop
            if listener is not None:
                by_owner.setdefault(id(listener), (listener, []))[1].append(k)
        for fn, ks in by_owner.values():
            fn(ks)

    def total_capacity(self) -> int:
        """Budget bytes over every tier and pool, each pool once: a budget kinds share
        (``kv_state``) counts once, where summing ``capacity(kind)`` over kinds counts it
        for each of them."""
        with self.lock:
            return sum(int(v) for s in self.ledger.specs for v in s.pools.values())

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
