"""``ObjectStore``: the store interface. Every caller that holds bytes in this process (the
embedded cache, the cache server, the SGLang page store, the simulator, tests) names this
one type; ``TieredStore`` (``hybrid_connector.tiers.manager``) is the implementation over
this process's tiers, ``MemoryStore`` a one-tier instance of it and ``SizeOnlyStore`` the
simulator's byte-accounting one.

An object store is two halves:

* the ledger half (``hybrid_connector.tiers.backend.Backend``): the ledger of what is where
  and the budgets, the lock that guards it, the ``StoreHooks`` of every index attached to
  it (by model fingerprint) and the ``executor`` that runs the ledger's ops on the tiers.
  A process whose bytes live elsewhere (a vLLM scheduler, whose bytes are in its TP
  workers) holds this half alone and ships the ops; an index needs only this half.
* the objects, batch-first (below): keyed tensors put, read, pinned and removed without an
  index, each call settled when it returns.

Contract shared by every implementation:

* Payloads are contiguous ``torch.Tensor`` objects; ``put`` copies them, so the caller may
  reuse its buffer as soon as ``put`` returns.
* Capacity is per object kind (``ObjectKind``); ``put`` never exceeds it. A store may move
  objects between its own tiers, but it never drops an object silently: every drop it
  decides on its own is reported to the hooks of the key's owner (with the keys), so that
  index can forget them. ``remove`` (the caller's own decision) reports nothing.
* A failed read (missing, corrupt, remote down) is a ``None`` result (or False, or a
  ``None`` from a load handle), never an exception.
* Several indexes (a node server hosts several models) may share one store: each attaches
  its ``StoreHooks`` under its model fingerprint (``attach``) and is told only about its
  own keys.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers.backend import Backend
from hybrid_connector.tiers.hooks import CompanionFn, DemotionFilter, DropListener, StoreHooks

if TYPE_CHECKING:
    from hybrid_connector.tiers.executor import Executor
    from hybrid_connector.tiers.loads import LoadHandle
    from hybrid_connector.tiers.tier import Tier

__all__ = ["CompanionFn", "DemotionFilter", "DropListener", "ObjectStore", "StoreHooks"]


class ObjectStore(Backend, ABC):
    """Keyed tensor store with per-kind byte budgets whose bytes live in this process (see
    the module docstring); ``tiers``: its tiers, fastest first. ``close()`` (the ledger
    half's) releases the executor; an implementation that holds more extends it."""

    executor: Executor  # the bytes are here: never None for an object store
    tiers: list[Tier]

    # ------------------------------------------------------------------ room
    @abstractmethod
    def capacity(self, kind: ObjectKind) -> int:
        """Total bytes this store can hold for ``kind`` (0: the kind is not stored). Kinds
        sharing a budget (``kv_state``) each report all of it, so a sum over kinds counts
        it twice: the store's total is ``total_capacity()``."""

    @abstractmethod
    def used(self, kind: ObjectKind) -> int:
        """Bytes currently held for ``kind``."""

    @abstractmethod
    def max_object_bytes(self, kind: ObjectKind) -> int:
        """The largest single object of ``kind`` the store could ever hold (a tiered store:
        its largest tier pool). Evicting can never make room for anything bigger."""

    @abstractmethod
    def where(self, keys: Sequence[ObjectKey]) -> list[str | None]:
        """Name of the tier holding each key (``None`` if absent). No side effects."""

    @abstractmethod
    def keys(self, kind: ObjectKind) -> list[ObjectKey]:
        """Every unpinned key of ``kind`` held now, the first to go first (a snapshot)."""

    @abstractmethod
    def tier(self, name: str) -> Tier:
        """The tier called ``name``; KeyError when there is none."""

    # ------------------------------------------------------------------ writes
    @abstractmethod
    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]],
            metas: Sequence[ObjectMeta | None] | None = None) -> list[bool]:
        """Store copies of the payloads; element i is False when item i was not stored
        (no room, bad payload, metadata that does not describe its key, I/O failure). An
        existing key is overwritten. ``metas`` (None, or one ``ObjectMeta`` or None per
        item; ValueError otherwise) travel with the objects through every tier."""

    @abstractmethod
    def remove(self, keys: Sequence[ObjectKey]) -> None:
        """Forget the keys (missing keys are ignored). Not reported to the drop listener."""

    # ------------------------------------------------------------------ pins
    @abstractmethod
    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Protect the keys from demotion and eviction until ``unpin`` (counted, so pins
        nest); element i is False when key i is absent."""

    @abstractmethod
    def unpin(self, keys: Sequence[ObjectKey]) -> None:
        """Undo one ``pin`` of each key (absent keys are ignored)."""

    # ------------------------------------------------------------------ reads
    @abstractmethod
    def get(self, keys: Sequence[ObjectKey]) -> list[torch.Tensor | None]:
        """Payloads by key (``None`` on any miss or failure). The returned tensors belong
        to the caller: later store operations never modify them."""

    @abstractmethod
    def get_into(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        """Read into caller buffers (matching dtype and shape, any device); False on a miss
        or mismatch (that buffer's content is then undefined). ValueError when the lengths
        differ."""

    @abstractmethod
    def get_async(self, keys: Sequence[ObjectKey]) -> LoadHandle:
        """Start loading ``keys``; ``handle.wait(i)`` gives object i (or None)."""

    @abstractmethod
    def get_into_async(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]
                       ) -> LoadHandle:
        """Start loading ``keys`` into ``outs``; ``handle.wait(i)`` returns ``outs[i]`` once
        landed, or None on a miss."""

    # ------------------------------------------------------------------ misc
    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """A snapshot of counters: ``tiers`` (name -> ``TierStats``) and the store's own
        movement counters."""
