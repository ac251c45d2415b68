"""The ``Tier`` interface: one storage level (device, host, NVMe, remote) with per-kind pools.

Batch-first, in the spirit of LMCache's ``StorageBackendInterface``. Every call takes a
sequence and answers per element. Values are contiguous ``torch.Tensor`` payloads whose
dtype and shape are kept exactly (a tier that serialises must round-trip both bit for bit).

Contract shared by every tier:

* A tier never evicts on its own: ``put`` of an object that does not fit its kind's pool
  fails (False) and leaves the tier unchanged. Choosing victims (``lru``) and moving them is
  the ``TieredStore``'s job, so a tier never loses an object without its caller knowing.
* ``put`` copies; the caller may reuse its tensor as soon as ``put`` returns. Overwriting an
  existing key replaces it atomically (readers see the old or the new object, never a mix).
* ``get_into`` writes into caller buffers; ``get`` allocates. A failed read (missing,
  corrupt, I/O error, remote down) is ``False``/``None`` for that element, never an
  exception. A corrupt or vanished object is forgotten by the tier when it is detected
  (the manager reports it as dropped); one that is only unreachable for now stays.
* ``pin`` keeps an object from appearing in ``lru`` (so it is never chosen for demotion or
  eviction); pins nest. ``remove`` of a pinned object hides it at once, and its storage is
  reclaimed at the last ``unpin`` (so an in-flight read stays valid).
* A put may carry each object's ``ObjectMeta`` (what an index needs to re-link it after
  a restart); the tier keeps it with the object (``object_meta``, ``inventory``), a
  persistent tier stores it with the bytes, and a move hands it on.
* Thread safe. ``close`` releases resources; the tier must not be used afterwards.

``IndexedTier`` (the shared index, LRU, pin and deferred-free bookkeeping that the concrete
tiers build on) lives in ``hybrid_connector.tiers.indexed``.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta

log = logging.getLogger(__name__)


def nbytes_of(t: torch.Tensor) -> int:
    """Payload size in bytes."""
    return t.numel() * t.element_size()


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for contiguous tensors of the same dtype and size. Host to host it
    is one plain single-threaded ``memmove`` (GIL released): torch's intra-op parallel copy
    stalls for milliseconds when the other cores are busy, which an engine's always are."""
    n = dst.numel() * dst.element_size()
    if (dst.device.type == "cpu" and src.device.type == "cpu" and dst.dtype == src.dtype
            and src.numel() == dst.numel() and dst.is_contiguous() and src.is_contiguous()):
        if n:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), n)
    else:
        dst.copy_(src)  # synchronous: the caller may reuse ``src`` right away


def byte_view(t: torch.Tensor) -> memoryview:
    """Writable flat byte view of a contiguous CPU tensor's storage (valid while ``t`` lives)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous CPU tensor")
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray(0))
    return memoryview(_ubytes(n).from_address(t.data_ptr())).cast("B")


@functools.lru_cache(maxsize=256)
def _ubytes(n: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    # Building a ctypes array type costs ~30 us, the view itself ~2 us; object sizes repeat.
    return ctypes.c_ubyte * n


def check_payload(t: object) -> str | None:
    """Why ``t`` cannot be stored (None: it can)."""
    if not isinstance(t, torch.Tensor):
        return f"payload must be a torch.Tensor, got {type(t).__name__}"
    if not t.is_contiguous():
        return "payload must be contiguous"
    if t.is_sparse or t.is_quantized:
        return "payload must be a dense tensor"
    return None


def check_metas(items: Sequence[object], metas: Sequence[ObjectMeta | None] | None
                ) -> Sequence[ObjectMeta | None]:
    """``metas`` aligned with ``items`` (all None when ``metas`` is None); ValueError when
    the lengths differ or an element is neither an ``ObjectMeta`` nor None."""
    if metas is None:
        return [None] * len(items)
    if len(metas) != len(items):
        raise ValueError(f"{len(items)} items but {len(metas)} metas")
    for m in metas:
        if m is not None and not isinstance(m, ObjectMeta):
            raise ValueError(f"meta must be an ObjectMeta or None, got {type(m).__name__}")
    return metas


class TierUnavailable(Exception):
    """A tier could not serve a read for a passing reason (remote down, timeout)."""


@dataclass(slots=True)
class TierRecord:
    """What a tier knows about one stored object (the tier's record; the ledger's record of
    the same object is ``hybrid_connector.tiers.ledger.records.Entry``)."""

    key: ObjectKey
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    handle: object = None  # tier-specific location (slab offset, file name, remote name)
    pins: int = 0
    doomed: bool = False  # removed while pinned: reclaim at the last unpin
    meta: ObjectMeta | None = None  # what the put carried (a persistent tier: the file)


@dataclass(slots=True)
class TierStats:
    """Counters of one tier (monotonic except ``objects``/``used``). ``capacity``: the most
    bytes each kind may take (kinds sharing a budget each list all of it, so its values
    must not be summed); ``pools``: budget bytes by pool, a shared budget once under its
    kinds' values joined with ``_`` (``kv_state``): what the tier's total capacity sums."""

    name: str
    objects: dict[str, int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    pools: dict[str, int] = field(default_factory=dict)
    puts: int = 0
    put_failures: int = 0
    hits: int = 0
    misses: int = 0
    errors: int = 0
    bytes_written: int = 0
    bytes_read: int = 0


class Tier(ABC):
    """One storage level with per-kind byte budgets. See the module docstring.

    Facts the ledger reads: ``slow`` (reads are async: disk, remote), ``shared`` (other
    instances read and write it too: it gets copies and is never deleted from), and
    ``granularity(kind)`` (an object takes its size rounded up to that many bytes)."""

    name: str
    slow = False
    shared = False

    def granularity(self, kind: ObjectKind) -> int:
        """Bytes an object of ``kind`` is rounded up to in this tier's pool (1: exact)."""
        return 1

    @abstractmethod
    def capacity(self, kind: ObjectKind) -> int:
        """Byte budget of ``kind``'s pool (0: the kind is not stored here)."""

    @abstractmethod
    def used(self, kind: ObjectKind) -> int:
        """Bytes of ``kind`` held now (payload bytes, excluding per-object headers)."""

    @abstractmethod
    def contains(self, keys: Sequence[ObjectKey], pin: bool = False) -> list[bool]:
        """Whether each key is held; with ``pin`` each present key is also pinned (the
        caller must ``unpin`` it). A removed-while-pinned object is not contained."""

    @abstractmethod
    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]],
            metas: Sequence[ObjectMeta | None] | None = None) -> list[bool]:
        """Store copies; element i False when item i was not stored (no room in its pool,
        bad payload, metadata that cannot describe its key, I/O failure), in which case
        any old object under that key survives. ``metas``: None, or one ``ObjectMeta`` or
        None per item (ValueError if the lengths differ or an element is neither), kept
        with the object; an overwrite replaces the old object's metadata too."""

    @abstractmethod
    def get_into(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        """Read each object into ``outs[i]`` (same dtype and shape, any device). False on a
        miss, a mismatched buffer or a failed read; ``outs[i]`` content is then undefined."""

    @abstractmethod
    def get(
        self, keys: Sequence[ObjectKey], device: torch.device | str | None = None
    ) -> list[torch.Tensor | None]:
        """Read into fresh tensors owned by the caller (on ``device``, default CPU)."""

    @abstractmethod
    def meta(self, key: ObjectKey) -> tuple[tuple[int, ...], torch.dtype, int] | None:
        """``(shape, dtype, nbytes)`` of a held object, for sizing buffers; no side effects."""

    @abstractmethod
    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Pin each held key (False: absent). Nested pins need as many ``unpin`` calls."""

    @abstractmethod
    def unpin(self, keys: Sequence[ObjectKey]) -> None:
        """Undo one ``pin`` per key (unpinned or absent keys are ignored)."""

    @abstractmethod
    def remove(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Forget each key (False: absent). Pinned objects vanish now, storage later."""

    @abstractmethod
    def lru(self, kind: ObjectKind) -> Iterator[ObjectKey]:
        """Unpinned objects of ``kind``, least recently used first (a snapshot)."""

    @abstractmethod
    def held_keys(self) -> list[ObjectKey]:
        """Every held (not removed) key."""

    @abstractmethod
    def stats(self) -> TierStats:
        """A snapshot of the counters."""

    def object_meta(self, key: ObjectKey) -> ObjectMeta | None:
        """The ``ObjectMeta`` the held object ``key`` carries (None: absent, or stored
        without one). No side effects. The default tier keeps none."""
        return None

    def inventory(self) -> list[tuple[ObjectKey, int, ObjectMeta | None]]:
        """``(key, nbytes, meta)`` of every held object, kind by kind (``ObjectKind``
        order), each kind least recently used first (a persistent tier after a restart:
        oldest file first); a snapshot, pinned objects included. What an index rebuilds
        itself from at a warm restart."""
        out: list[tuple[ObjectKey, int, ObjectMeta | None]] = []
        held = self.held_keys()
        for kind in ObjectKind:
            for k in held:
                if k.kind is kind and (m := self.meta(k)) is not None:
                    out.append((k, m[2], self.object_meta(k)))
        return out

    def fits(self, kind: ObjectKind, nbytes: int) -> bool:
        """Whether a put of ``nbytes`` of ``kind`` would find room now (no side effects)."""
        return self.used(kind) + nbytes <= self.capacity(kind)

    def is_pinned(self, key: ObjectKey) -> bool:
        """Whether ``key`` is held and pinned."""
        return self.pin_count(key) > 0

    def pin_count(self, key: ObjectKey) -> int:
        """Pins on the held object ``key`` (0 when absent or unpinned)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; the tier must not be used afterwards."""

    # Async variants. Default: run the batch call on the caller's executor; tiers with a
    # native async path override these.
    def get_into_async(
        self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]
    ) -> Future[list[bool]]:
        """``get_into`` whose result can be awaited; the buffers must stay alive and
        untouched until the future is done."""
        fut: Future[list[bool]] = Future()
        try:
            fut.set_result(self.get_into(keys, outs))
        except BaseException as exc:  # pragma: no cover - get_into never raises
            fut.set_exception(exc)
        return fut
