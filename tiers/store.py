"""The store interface the cache uses: batch-first puts and gets of keyed tensors.

Contract shared by every implementation:

* Payloads are contiguous ``torch.Tensor`` objects; ``put`` copies them, so the caller may
  reuse its buffer as soon as ``put`` returns.
* Capacity is per object kind (``ObjectKind``); ``put`` never exceeds it. An implementation
  may move objects between its own tiers, but it never drops an object silently: every
  drop it decides on its own is reported through the drop listener (with the keys), so the
  index can forget them. ``remove`` (the caller's own decision) reports nothing.
* A failed read (missing, corrupt, remote down) is a ``None`` result, never an exception.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch

from hybrid_connector.keys import ObjectKey, ObjectKind

DropListener = Callable[[Sequence[ObjectKey]], None]
DemotionFilter = Callable[[ObjectKey], bool]
CompanionFn = Callable[[ObjectKey], Sequence[ObjectKey]]


class ObjectStore(ABC):
    """Keyed tensor store with per-kind byte budgets."""

    _drop_listener: DropListener | None = None
    _demotion_filter: DemotionFilter | None = None

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

    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Protect the keys from demotion and eviction until ``unpin`` (counted, so pins
        nest); element i is False when key i is absent. The default store never moves
        objects on its own, so it only reports presence."""
        return [t is not None for t in self.where(keys)]

    def unpin(self, keys: Sequence[ObjectKey]) -> None:  # noqa: B027 - optional hook
        """Undo one ``pin`` of each key (absent keys are ignored)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; the store must not be used afterwards."""

    def set_drop_listener(self, listener: DropListener | None) -> None:
        """Register the callback told about objects the store dropped on its own."""
        self._drop_listener = listener

    def set_demotion_filter(self, merits: DemotionFilter | None) -> None:
        """Register the policy hook deciding whether an evicted object merits demotion."""
        self._demotion_filter = merits

    def set_companions(self, companions: CompanionFn | None) -> None:  # noqa: B027 - optional
        """Register ``companions(kv_key) -> anchor keys`` riding on that KV chunk, so a store
        that drops KV on its own drops (and reports) those anchors with it. Stores that never
        drop on their own ignore it. Called with the store's lock held: must not block."""

    def _report_dropped(self, keys: Sequence[ObjectKey]) -> None:
        if keys and self._drop_listener is not None:
            self._drop_listener(list(keys))
