"""``TierManager``: an ``ObjectStore`` over an ordered list of tiers (fastest first).

Placement rules (per object kind, each kind in its own pool in every tier):

* Exclusive tiers: an object lives in exactly one tier, so ``used(kind)`` and
  ``capacity(kind)`` are plain sums over the tiers and the cache's accounting holds.
* ``put`` goes to the topmost tier whose pool for the kind can hold the object, making
  room there by moving that pool's least-recently-used unpinned objects down: a victim is
  demoted to the next tier that stores its kind when the demotion filter (the eviction
  policy's ``merits_demotion``; no filter means yes) agrees and it fits there (making
  room recursively), otherwise it is dropped and reported through the drop listener.
  Nothing is ever dropped silently. Pools are per kind, so anchor (or state) pressure can
  never evict KV; anchors die with their KV through the owner's ``StoreHooks.companions``.
* A hit in a lower tier is promoted to the top tier (moved, not copied); a pinned object
  moves only when the top tier has room without dropping anything, and its pins move too.
* ``pin``/``unpin``: a pinned object is never demoted, promoted or dropped by the manager
  (``remove`` is the caller's own decision and still works).
* Reads pin the object while they run, outside the manager lock, so several loads run in
  parallel; ``get_async``/``get_into_async`` run them on ``tiers.copy_engine.CopyEngine``
  (copy streams and events on CUDA, a bounded thread pool elsewhere) and return a
  ``LoadHandle`` that can be awaited per object, so a load overlaps compute.

Thread safety: one re-entrant lock serialises placement; drop reports are delivered after
it is released (the listener may call back into the store).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from hybrid_connector.config import HybridConfig
from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers.copy_engine import CopyEngine, LayerTransfer, LayerTransferError, TransferJob
from tiers.store import ObjectStore
from tiers.tier import Tier, TierStats, check_payload, nbytes_of

log = logging.getLogger(__name__)



class _Miss(Exception):
    """A key was not readable (turned into ``None`` by ``LoadHandle.wait``)."""


@dataclass
class ManagerStats:
    """Movement counters (monotonic)."""

    demotions: Counter[str] = field(default_factory=Counter)  # by kind
    promotions: Counter[str] = field(default_factory=Counter)
    drops: Counter[str] = field(default_factory=Counter)
    put_failures: int = 0
    misses: int = 0


class LoadHandle:
    """Per-object readiness of an async load. ``wait(i)`` returns object ``i``'s tensor
    (the caller's buffer for ``get_into_async``) once it has landed, or ``None`` when it
    was missing or unreadable; it raises ``TimeoutError`` only when ``timeout`` expires.
    On CUDA, ``wait`` makes the current stream wait on the copy (``sync=True`` also blocks
    the host). Buffers must not be touched before their ``wait`` returned."""

    def __init__(self, job: TransferJob, keys: Sequence[ObjectKey]) -> None:
        self._job = job
        self.keys = list(keys)

    def wait(self, index: int, timeout: float | None = None, sync: bool = False) -> torch.Tensor | None:
        if not 0 <= index < len(self.keys):
            raise IndexError(f"object index {index} outside [0, {len(self.keys)})")
        try:
            return self._job.wait(str(index), timeout, sync=sync)
        except LayerTransferError:
            return None

    def wait_all(self, timeout: float | None = None) -> list[torch.Tensor | None]:
        return [self.wait(i, timeout) for i in range(len(self.keys))]

    def done(self) -> bool:
        return self._job.done()

    def cancel(self) -> int:
        """Cancel the loads not started yet (their ``wait`` returns None)."""
        return self._job.cancel()


class TierManager(ObjectStore):
    """Tiered ``ObjectStore``; see the module docstring. ``tiers`` fastest first, with
    unique names. ``load_device``: where ``get`` allocates results (default CPU)."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        load_device: torch.device | str = "cpu",
        max_workers: int = 2,
        copy_device: torch.device | str | None = None,
        promote: bool = True,
    ) -> None:
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        self.tiers = list(tiers)
        self.load_device = torch.device(load_device)
        self.promote = promote
        self._lock = threading.RLock()
        self._copy = CopyEngine(max_workers=max_workers, device=copy_device)
        self.mstats = ManagerStats()
        # Pins taken through the manager, per key, with the tier that holds each.
        self._pins: dict[ObjectKey, list[Tier]] = {}
        self._local = threading.local()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: HybridConfig, device: torch.device | str | None = None) -> TierManager:
        """Tiers from the config's typed keys (``extra_config`` is never read): device
        (``device_size``/``pools.device``), host (``max_local_cpu_size``/``pools.host``),
        disk (``local_disk`` + its budget, ``disk_zstd``, ``disk_fsync``,
        ``disk_verify_reads``), remote (``remote_url`` + ``pools.remote``, ``remote_serde``,
        ``remote_timeout_s``). A tier whose budget is all zero is left out (the config
        rejects a disk or remote tier named without a budget). Raises ValueError/OSError for
        a bad remote URL or an unusable disk path."""
        from tiers.device import DeviceTier
        from tiers.host import HostTier
        from tiers.nvme import NvmeTier
        from tiers.remote import RemoteTier

        def budgets(tier: str) -> dict[ObjectKind, int]:
            b = config.budget(tier)
            return {ObjectKind.KV: b.kv, ObjectKind.STATE: b.state, ObjectKind.ANCHOR: b.anchor}

        tiers: list[Tier] = []
        if config.budget("device").total:
            tiers.append(DeviceTier(budgets("device"), device=device))
        if config.budget("host").total:
            tiers.append(HostTier(budgets("host")))
        if config.disk_path and config.budget("disk").total:
            tiers.append(NvmeTier(
                config.disk_path, budgets("disk"), zstd=_zstd_kinds(config),
                fsync=config.disk_fsync, verify_reads=config.disk_verify_reads))
        if config.remote_url and config.budget("remote").total:
            tiers.append(RemoteTier(
                config.remote_url, budgets("remote"), serde=config.remote_serde,
                timeout=config.remote_timeout_s))
        return cls(tiers)

    # ------------------------------------------------------------------ accounting
    def capacity(self, kind: ObjectKind) -> int:
        return sum(t.capacity(kind) for t in self.tiers)

    def max_object_bytes(self, kind: ObjectKind) -> int:
        """Exclusive tiers: an object must fit one tier's pool whole."""
        return max((t.capacity(kind) for t in self.tiers), default=0)

    def keys(self, kind: ObjectKind) -> list[ObjectKey]:
        """Unpinned keys of ``kind``, slowest tier first, each tier least recently used
        first (what has sat longest at the bottom goes first)."""
        with self._lock:
            return [k for t in reversed(self.tiers) for k in t.lru(kind)]

    def used(self, kind: ObjectKind) -> int:
        with self._lock:
            return sum(t.used(kind) for t in self.tiers)

    def where(self, keys: Sequence[ObjectKey]) -> list[str | None]:
        with self._lock:
            return [(t.name if (t := self._holder(k)) is not None else None) for k in keys]

    def _holder(self, key: ObjectKey) -> Tier | None:
        for t in self.tiers:
            if t.contains([key])[0]:
                return t
        return None

    def tier(self, name: str) -> Tier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"no tier named {name!r}; tiers: {[t.name for t in self.tiers]}")

    # ------------------------------------------------------------------ drops
    def _pending(self) -> list[ObjectKey]:
        p: list[ObjectKey] | None = getattr(self._local, "dropped", None)
        if p is None:
            p = []
            self._local.dropped = p
        return p

    def _flush_drops(self) -> None:
        """Report drops collected by this thread (call with the lock released)."""
        p = self._pending()
        if p:
            keys = list(p)
            p.clear()
            self._report_dropped(keys)

    def _drop(self, tier: Tier, key: ObjectKey) -> None:
        tier.remove([key])
        self.mstats.drops[key.kind.value] += 1
        self._pending().append(key)
        if key.kind is ObjectKind.KV:
            # Anchors die with their KV chunk (only the index knows which ride on it).
            for anchor in self._companions_of(key):
                if anchor.kind is not ObjectKind.ANCHOR or anchor in self._pins:
                    continue  # companions are anchors; a pinned one is being loaded
                holder = self._holder(anchor)
                if holder is not None and not holder.is_pinned(anchor):
                    holder.remove([anchor])
                    self.mstats.drops[anchor.kind.value] += 1
                    self._pending().append(anchor)

    # ------------------------------------------------------------------ placement
    def _below(self, i: int, kind: ObjectKind, nbytes: int) -> int | None:
        for j in range(i + 1, len(self.tiers)):
            if self.tiers[j].capacity(kind) >= nbytes:
                return j
        return None

    def _make_room(self, i: int, kind: ObjectKind, nbytes: int, spare: ObjectKey) -> bool:
        """Move LRU unpinned objects of ``kind`` out of tier ``i`` until ``nbytes`` fit.
        ``spare`` is never chosen (it is the object being placed). Lock held."""
        tier = self.tiers[i]
        while not tier.fits(kind, nbytes):
            victim = next((k for k in tier.lru(kind) if k != spare), None)
            if victim is None:
                return False
            self._evict(i, victim)
        return True

    def _evict(self, i: int, key: ObjectKey) -> None:
        """Demote ``key`` from tier ``i`` if it merits and fits below, else drop it."""
        tier = self.tiers[i]
        meta = tier.meta(key)
        if meta is None:
            return
        j = self._below(i, key.kind, meta[2])
        merits = self._merits_demotion(key)
        if j is not None and merits:
            data = tier.get([key])[0]
            if data is not None and self._place(j, key, data):
                tier.remove([key])
                self.mstats.demotions[key.kind.value] += 1
                return
        self._drop(tier, key)

    def _place(self, i: int, key: ObjectKey, payload: torch.Tensor, stop: int | None = None) -> bool:
        """Put into tier ``i`` or, failing that, the tiers below it (above ``stop`` when
        given). On success every other copy of ``key`` is removed. Lock held."""
        n = nbytes_of(payload)
        for j in range(i, len(self.tiers) if stop is None else stop):
            t = self.tiers[j]
            if t.capacity(key.kind) < n:
                continue
            if self._make_room(j, key.kind, n, key) and t.put([(key, payload)])[0]:
                for other in self.tiers:  # exclusive tiers: drop stale copies elsewhere
                    if other is not t:
                        other.remove([key])
                return True
        return False

    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]]) -> list[bool]:
        out = []
        try:
            with self._lock:
                for key, payload in items:
                    if not isinstance(key, ObjectKey):
                        raise TypeError(f"key must be an ObjectKey, got {type(key).__name__}")
                    ok = check_payload(payload) is None and self._place(0, key, payload)
                    if not ok:
                        self.mstats.put_failures += 1
                    out.append(ok)
        finally:
            self._flush_drops()
        return out

    def remove(self, keys: Sequence[ObjectKey]) -> None:
        with self._lock:
            for t in self.tiers:
                t.remove(keys)

    # ------------------------------------------------------------------ pins
    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Pin each present key where it lives (False: absent). Pins nest; a pinned object
        is never demoted, promoted or dropped by the manager until ``unpin``."""
        out = []
        with self._lock:
            for k in keys:
                t = self._holder(k)
                if t is not None and t.pin([k])[0]:
                    self._pins.setdefault(k, []).append(t)
                    out.append(True)
                else:
                    out.append(False)
        return out

    def unpin(self, keys: Sequence[ObjectKey]) -> None:
        """Undo one ``pin`` per key (keys not pinned are ignored)."""
        with self._lock:
            for k in keys:
                ts = self._pins.get(k)
                if ts:
                    ts.pop().unpin([k])
                    if not ts:
                        del self._pins[k]

    # ------------------------------------------------------------------ reads
    def _start_read(self, key: ObjectKey) -> tuple[Tier, int, tuple[tuple[int, ...], torch.dtype, int]] | None:
        with self._lock:
            for i, t in enumerate(self.tiers):
                meta = t.meta(key)
                if meta is not None and t.pin([key])[0]:
                    return t, i, meta
        return None

    def _end_read(self, tier: Tier, i: int, key: ObjectKey, data: torch.Tensor | None) -> None:
        try:
            with self._lock:
                tier.unpin([key])
                if data is None or i == 0 or not self.promote or not tier.contains([key])[0]:
                    return
                held = self._pins.get(key, [])
                # Only the manager's own pins may be on it (no other read in flight), and
                # they must all be on this copy; then the pins move up with the object.
                if tier.pin_count(key) != len(held) or any(t is not tier for t in held):
                    return
                top = next((j for j, t in enumerate(self.tiers[:i])
                            if t.capacity(key.kind) >= nbytes_of(data)), None)
                if top is None:
                    return
                src = data if data.device.type == "cpu" else data.cpu()
                if held:
                    # Pinned: it must never be dropped, so the old copy stays until the new
                    # one is in (``_place`` then removes it; the pins release it).
                    if not self._place(top, key, src, stop=i):
                        return
                    for _ in held:
                        tier.unpin([key])
                    home = self._holder(key)
                    assert home is not None
                    home.pin([key] * len(held))
                    self._pins[key] = [home] * len(held)
                    self.mstats.promotions[key.kind.value] += 1
                    return
                # Take it out first so the cascade of demotions below can use its room.
                tier.remove([key])
                if self._place(top, key, src):
                    self.mstats.promotions[key.kind.value] += 1
                else:  # nowhere to go any more (pinned pools): report, never silent
                    self.mstats.drops[key.kind.value] += 1
                    self._pending().append(key)
        finally:
            self._flush_drops()

    def _read_one(self, key: ObjectKey, out: torch.Tensor | None) -> torch.Tensor | None:
        started = self._start_read(key)
        if started is None:
            self.mstats.misses += 1
            return None
        tier, i, (shape, dtype, _n) = started
        data: torch.Tensor | None = None
        try:
            if out is None:
                data = tier.get([key], device=self.load_device)[0]
            elif tuple(out.shape) == shape and out.dtype == dtype and tier.get_into([key], [out])[0]:
                data = out
        finally:
            if data is None and not tier.contains([key])[0] and self._holder(key) is None:
                # The tier found it corrupt or gone and forgot it: that is a drop too.
                with self._lock:
                    self.mstats.drops[key.kind.value] += 1
                    self._pending().append(key)
            self._end_read(tier, i, key, data)
        if data is None:
            self.mstats.misses += 1
        return data

    def get(self, keys: Sequence[ObjectKey]) -> list[torch.Tensor | None]:
        return [self._read_one(k, None) for k in keys]

    def get_into(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        """Read into caller buffers (matching dtype and shape, any device); False on a
        miss or mismatch (that buffer's content is then undefined)."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        return [self._read_one(k, o) is not None for k, o in zip(keys, outs, strict=True)]

    def get_async(self, keys: Sequence[ObjectKey]) -> LoadHandle:
        """Start loading ``keys``; ``handle.wait(i)`` gives object i (or None)."""
        def fetch(k: ObjectKey) -> torch.Tensor:
            t = self._read_one(k, None)
            if t is None:
                raise _Miss(k.to_str())
            return t

        transfers = [LayerTransfer(str(i), fetch=partial(fetch, k)) for i, k in enumerate(keys)]
        return LoadHandle(self._copy.submit_layers(transfers, cancel_on_error=False), keys)

    def get_into_async(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> LoadHandle:
        """Start loading ``keys`` into ``outs`` (device buffers land via the copy stream);
        ``handle.wait(i)`` returns ``outs[i]`` once landed, or None on a miss."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")

        def fetch(k: ObjectKey, dst: torch.Tensor) -> torch.Tensor | None:
            if dst.device.type == "cpu":
                if self._read_one(k, dst) is None:
                    raise _Miss(k.to_str())
                return None  # filled dst itself
            staged = self._read_one(k, None)
            if staged is None or tuple(staged.shape) != tuple(dst.shape) or staged.dtype != dst.dtype:
                raise _Miss(k.to_str())
            return staged

        transfers = [LayerTransfer(str(i), dst=o, fetch=partial(fetch, k, o))
                     for i, (k, o) in enumerate(zip(keys, outs, strict=True))]
        return LoadHandle(self._copy.submit_layers(transfers, cancel_on_error=False), keys)

    # ------------------------------------------------------------------ misc
    def stats(self) -> dict[str, Any]:
        """Per-tier ``TierStats`` plus movement counters (a snapshot)."""
        with self._lock:
            tiers: dict[str, TierStats] = {t.name: t.stats() for t in self.tiers}
            return {"tiers": tiers, "demotions": dict(self.mstats.demotions),
                    "promotions": dict(self.mstats.promotions), "drops": dict(self.mstats.drops),
                    "put_failures": self.mstats.put_failures, "misses": self.mstats.misses}

    def close(self) -> None:
        self._copy.close()
        with self._lock:
            for t in self.tiers:
                t.close()


def _zstd_kinds(config: HybridConfig) -> dict[ObjectKind, int]:
    """``config.disk_zstd`` (kind name -> level, validated at load) keyed by ``ObjectKind``."""
    return {ObjectKind(k): level for k, level in config.disk_zstd.items()}


def build_store(config: HybridConfig, device: torch.device | str | None = None) -> ObjectStore:
    """The store the cache and CLI use: a ``TierManager`` over the configured tiers."""
    return TierManager.from_config(config, device=device)
