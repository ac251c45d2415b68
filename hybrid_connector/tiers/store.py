"""The store interface the cache uses: batch-first puts and gets of keyed tensors.

Contract shared by every implementation:

* Payloads are contiguous ``torch.Tensor`` objects; ``put`` copies them, so the caller may
  reuse its buffer as soon as ``put`` returns.
* Capacity is per object kind (``ObjectKind``); ``put`` never exceeds it. An implementation
  may move objects between its own tiers, but it never drops an object silently: every
  drop it decides on its own is reported to the hooks of the key's owner (with the keys),
  so that index can forget them. ``remove`` (the caller's own decision) reports nothing.
* A failed read (missing, corrupt, remote down) is a ``None`` result, never an exception.
* Several indexes (a node server hosts several models) may share one store through a
  ``hybrid_connector.tiers.backend.Backend``: each attaches its ``StoreHooks`` under its model fingerprint
  and is told only about its own keys.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ledger_value import ValueFn

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
    byte in a tier for ``tier_eviction: value`` (``hybrid_connector.tiers.ledger_value``; no hook: unknown,
    LRU rules). The last three are called with the store's lock held: they must not block
    on other locks.
    """

    on_drop: DropListener | None = None
    merits_demotion: DemotionFilter | None = None
    companions: CompanionFn | None = None
    tier_value: ValueFn | None = None


class ObjectStore(ABC):
    """Keyed tensor store with per-kind byte budgets."""

    @abstractmethod
    def capacity(self, kind: ObjectKind) -> int:
        """Total bytes this store can hold for ``kind`` (0: the kind is not stored)."""

    @abstractmethod
    def used(self, kind: ObjectKind) -> int:
        """Bytes currently held for ``kind``."""

    @abstractmethod
    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]]) -> list[bool]:
        """Store copies of the payloads; element i is False when item i was not stored
        (no room, bad payload, I/O failure). An existing key is overwritten."""

    @abstractmethod
    def get(self, keys: Sequence[ObjectKey]) -> list[torch.Tensor | None]:
        """Payloads by key (``None`` on any miss or failure). The returned tensors belong
        to the caller: later store operations never modify them."""

    @abstractmethod
    def where(self, keys: Sequence[ObjectKey]) -> list[str | None]:
        """Name of the tier holding each key (``None`` if absent). No side effects."""

    @abstractmethod
    def remove(self, keys: Sequence[ObjectKey]) -> None:
        """Forget the keys (missing keys are ignored). Not reported to the drop listener."""

    @abstractmethod
    def keys(self, kind: ObjectKind) -> list[ObjectKey]:
        """Every unpinned key of ``kind`` held now, least recently used first (a snapshot;
        stores without an order return insertion order)."""

    # ------------------------------------------------------------------ room
    def max_object_bytes(self, kind: ObjectKind) -> int:
        """The largest single object of ``kind`` the store could ever hold (a tiered store:
        its largest tier pool). Evicting can never make room for anything bigger."""
        return self.capacity(kind)

    # ------------------------------------------------------------------ pins
    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Protect the keys from demotion and eviction until ``unpin`` (counted, so pins
        nest); element i is False when key i is absent. The default store never moves
        objects on its own, so it only reports presence."""
        return [t is not None for t in self.where(keys)]

    def unpin(self, keys: Sequence[ObjectKey]) -> None:  # noqa: B027 - optional hook
        """Undo one ``pin`` of each key (absent keys are ignored)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; the store must not be used afterwards."""
