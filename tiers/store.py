"""The store interface the cache uses: batch-first puts and gets of keyed tensors.

Contract shared by every implementation:

* Payloads are contiguous ``torch.Tensor`` objects; ``put`` copies them, so the caller may
  reuse its buffer as soon as ``put`` returns.
* Capacity is per object kind (``ObjectKind``); ``put`` never exceeds it. An implementation
  may move objects between its own tiers, but it never drops an object silently: every
  drop it decides on its own is reported to the hooks of the key's owner (with the keys),
  so that index can forget them. ``remove`` (the caller's own decision) reports nothing.
* A failed read (missing, corrupt, remote down) is a ``None`` result, never an exception.
* One store may serve several indexes (a node server hosts several models): each attaches
  its ``StoreHooks`` under its model fingerprint, and the store routes every callback for a
  key to the hooks of ``key.fingerprint`` (falling back to the default hooks set with the
  ``set_*`` methods, for single-owner use).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from hybrid_connector.keys import ObjectKey, ObjectKind

DropListener = Callable[[Sequence[ObjectKey]], None]
DemotionFilter = Callable[[ObjectKey], bool]
CompanionFn = Callable[[ObjectKey], Sequence[ObjectKey]]


@dataclass(frozen=True)
class StoreHooks:
    """What an index tells a store it shares.

    ``on_drop(keys)``: the store dropped these keys on its own (called without the store's
    lock; it may call back into the store). ``merits_demotion(key)``: whether an evicted
    object deserves a slower tier (no hook: yes). ``companions(kv_key)``: anchor keys that
    die with that KV chunk. The last two are called with the store's lock held: they must
    not block on other locks.
    """

    on_drop: DropListener | None = None
    merits_demotion: DemotionFilter | None = None
    companions: CompanionFn | None = None


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

    def fits(self, pending: Mapping[ObjectKind, int]) -> bool:
        """Whether ``pending`` more bytes per kind would all fit now, together."""
        return all(self.used(k) + n <= self.capacity(k) for k, n in pending.items() if n)

    def room_kinds(self, kind: ObjectKind) -> tuple[ObjectKind, ...]:
        """Kinds whose objects share a budget with ``kind`` (``kind`` first): evicting them
        makes room for it. Per-kind pools: only ``kind`` itself."""
        return (kind,)

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

    # ------------------------------------------------------------------ hooks
    @property
    def _hooks(self) -> dict[str | None, StoreHooks]:
        # Lazily created: subclasses need not call ``__init__``. None = the default hooks.
        hooks: dict[str | None, StoreHooks] | None = self.__dict__.get("_hc_hooks")
        if hooks is None:
            hooks = self.__dict__.setdefault("_hc_hooks", {None: StoreHooks()})
        return hooks

    def attach(self, fingerprint: str, hooks: StoreHooks) -> None:
        """Route callbacks for keys of ``fingerprint`` to ``hooks``. Raises ValueError when
        another index is attached under the same fingerprint (two indexes of one model on
        one store would evict each other's objects as unknown)."""
        if fingerprint in self._hooks:
            raise ValueError(f"an index for model fingerprint {fingerprint} is already "
                             "attached to this store")
        self._hooks[fingerprint] = hooks

    def detach(self, fingerprint: str) -> None:
        """Stop routing callbacks for ``fingerprint`` (unknown fingerprints are ignored)."""
        self._hooks.pop(fingerprint, None)

    def _hooks_of(self, key: ObjectKey) -> StoreHooks:
        hooks = self._hooks
        return hooks.get(key.fingerprint) or hooks[None]

    def _set_default(self, **fields: Any) -> None:
        self._hooks[None] = replace(self._hooks[None], **fields)

    def set_drop_listener(self, listener: DropListener | None) -> None:
        """Default drop listener, for keys whose fingerprint has no hooks attached."""
        self._set_default(on_drop=listener)

    def set_demotion_filter(self, merits: DemotionFilter | None) -> None:
        """Default demotion filter, for keys whose fingerprint has no hooks attached."""
        self._set_default(merits_demotion=merits)

    def set_companions(self, companions: CompanionFn | None) -> None:
        """Default companions function, for keys whose fingerprint has no hooks attached."""
        self._set_default(companions=companions)

    def _merits_demotion(self, key: ObjectKey) -> bool:
        merits = self._hooks_of(key).merits_demotion
        return merits is None or merits(key)

    def _companions_of(self, key: ObjectKey) -> Sequence[ObjectKey]:
        fn = self._hooks_of(key).companions
        return fn(key) if fn is not None else ()

    def _report_dropped(self, keys: Sequence[ObjectKey]) -> None:
        """Tell each key's owner about keys the store dropped (call without store locks)."""
        by_owner: dict[int, tuple[DropListener, list[ObjectKey]]] = {}
        for k in keys:
            listener = self._hooks_of(k).on_drop
            if listener is not None:
                by_owner.setdefault(id(listener), (listener, []))[1].append(k)
        for listener, ks in by_owner.values():
            listener(ks)
