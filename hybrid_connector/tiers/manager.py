"""``TieredStore``: the ``ObjectStore`` over this process's tiers. Its ledger half (the ledger
decides where every object lives, see ``hybrid_connector.tiers.ledger.ledger``) has an executor that runs
the ops on these tiers; its object calls use them without an index.

Placement (decided by the ledger): per object kind, each kind in its own pool in every
tier; exclusive local tiers; ``put`` goes to the fastest tier whose pool can hold the
object, demoting that pool's least recently used unpinned objects down (when the demotion
filter agrees and they fit below), dropping at the bottom and reporting every drop to the
key's owner; anchors die with their KV chunk (the owner's ``companions``); a shared tier
(remote) gets a copy of everything and is never deleted from. A hit in a lower tier is
promoted to the top (moved); pinned objects are never moved or dropped.

An index (``HybridCache``) stores through the same ledger and executor, asynchronously; the
object calls here wait for their ops. Reads run outside every lock.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers.backend import spec_of
from hybrid_connector.tiers.copy_engine import CopyEngine, LayerTransfer
from hybrid_connector.tiers.executor import Executor
from hybrid_connector.tiers.ledger.ledger import Placement, TierSpec
from hybrid_connector.tiers.loads import LoadHandle, Miss
from hybrid_connector.tiers.ops import Move, Op, Put
from hybrid_connector.tiers.store import ObjectStore
from hybrid_connector.tiers.tier import Tier, TierStats, check_metas, check_payload, nbytes_of

log = logging.getLogger(__name__)


@dataclass
class ManagerStats:
    """Movement counters (monotonic)."""

    drops: Counter[str] = field(default_factory=Counter)  # by kind
    put_failures: int = 0
    misses: int = 0


class TieredStore(ObjectStore):
    """Tiered store over ``tiers`` (fastest first, unique names). ``specs``: the ledger's
    view when it differs from the tiers' own budgets (the simulator's pooled budget);
    ``inline``: run ops in the caller's thread; ``load_device``: where ``get`` allocates."""

    def __init__(self, tiers: Sequence[Tier], load_device: torch.device | str = "cpu",
                 max_workers: int = 2, copy_device: torch.device | str | None = None,
                 promote: bool = True, inline: bool = False,
                 specs: Sequence[TierSpec] | None = None) -> None:
        shared = [t.name for t in tiers if getattr(t, "shared", False)]
        executor = Executor(tiers, shared=shared[0] if shared else None, inline=inline,
                            device=load_device)
        super().__init__(specs if specs is not None else [spec_of(t) for t in tiers], executor)
        self.executor: Executor = executor
        self.tiers = list(tiers)
        self.promote = promote
        self.mstats = ManagerStats()
        self._copy = CopyEngine(max_workers=max_workers, device=copy_device)
        self._adopt()

    def _adopt(self) -> None:
        """Account what the tiers already hold (a persistent tier's previous run), oldest
        first; what the ledger has no room for is deleted, so the tiers never hold bytes
        the ledger does not know. An index over this store then reclaims or re-indexes
        them (warm restart)."""
        with self.lock:
            for t in self.tiers:
                for kind in ObjectKind:
                    for key in list(t.lru(kind)):
                        meta = t.meta(key)
                        if meta is None or not self.ledger.adopt(key, meta[2], t.name):
                            t.remove([key])

    @classmethod
    def from_config(cls, config: HybridConfig, device: torch.device | str | None = None) -> TieredStore:
        """Tiers from the config's typed keys (``extra_config`` is never read): device
        (``device_size``/``pools.device``), host (``max_local_cpu_size``/``pools.host``),
        disk (``local_disk`` + its budget, ``disk_zstd``, ``disk_fsync``,
        ``disk_verify_reads``), remote (``remote_url`` + ``pools.remote``, ``remote_serde``,
        ``remote_timeout_s``). A tier whose budget is all zero is left out (the config
        rejects a disk or remote tier named without a budget). Raises ValueError/OSError for
        a bad remote URL or an unusable disk path."""
        from hybrid_connector.tiers.configured import build_tiers

        return cls(build_tiers(config, device))

    # ------------------------------------------------------------------ accounting
    def capacity(self, kind: ObjectKind) -> int:
        with self.lock:
            return self.ledger.capacity(kind)

    def used(self, kind: ObjectKind) -> int:
        with self.lock:
            return self.ledger.used(kind)

    def max_object_bytes(self, kind: ObjectKind) -> int:
        with self.lock:
            return self.ledger.max_object_bytes(kind)

    def where(self, keys: Sequence[ObjectKey]) -> list[str | None]:
        with self.lock:
            return [self.ledger.where(k) for k in keys]

    def keys(self, kind: ObjectKind) -> list[ObjectKey]:
        """Unpinned ready keys of ``kind``, slowest tier first, each least recently used
        first (what has sat longest at the bottom goes first)."""
        with self.lock:
            names = [s.name for s in reversed(self.ledger.specs)]
            return [k for n in names for k in self.ledger.held(n)
                    if k.kind is kind and not self.ledger.entries[k].pins]

    def tier(self, name: str) -> Tier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"no tier named {name!r}; tiers: {[t.name for t in self.tiers]}")

    # ------------------------------------------------------------------ ops
    def _run(self, ops: Sequence[Op], payloads: dict[ObjectKey, torch.Tensor] | None = None,
             metas: dict[ObjectKey, ObjectMeta] | None = None) -> list[bool]:
        """Run ops and wait. Call without the lock (the lanes take none)."""
        return self.executor.submit(ops, payloads or {}, metas=metas).result() if ops else []

    def _settle(self, ops: Sequence[Op], results: Sequence[bool],
                own: ObjectKey | None = None) -> list[ObjectKey]:
        """A failed move, or a failed put back of a taken object (a promotion), leaves no
        copy there: forget that copy (lock held); return the objects that are gone.
        ``own``: the key whose puts the caller commits itself."""
        lost: list[ObjectKey] = []
        for op, ok in zip(ops, results, strict=True):
            if ok or not (isinstance(op, Move) or (isinstance(op, Put) and op.key != own)):
                continue
            pl = self.ledger.lost(op.key, op.dst if isinstance(op, Move) else op.tier)
            lost += pl.dropped
        return lost

    def _drops(self, keys: Sequence[ObjectKey]) -> list[Op]:
        """Account drops, add the anchors riding on dropped KV (lock held); the ops remove
        those anchors' copies. ``keys`` is extended in place with them."""
        ops: list[Op] = []
        extra: list[ObjectKey] = []
        for k in keys:
            self.mstats.drops[k.kind.value] += 1
            if k.kind is not ObjectKind.KV:
                continue
            companions = self.hooks_of(k).companions
            for a in companions(k) if companions is not None else ():
                e = self.ledger.entries.get(a)
                if a.kind is ObjectKind.ANCHOR and e is not None and not e.pins:
                    ops += self.ledger.remove(a)
                    extra.append(a)
                    self.mstats.drops[a.kind.value] += 1
        if isinstance(keys, list):
            keys.extend(extra)
        return ops

    def _apply(self, placement: Placement) -> tuple[list[Op], list[ObjectKey]]:
        dropped = list(placement.dropped)
        return [*placement.ops, *self._drops(dropped)], dropped

    # ------------------------------------------------------------------ writes
    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]],
            metas: Sequence[ObjectMeta | None] | None = None) -> list[bool]:
        """``ObjectStore.put``; the metadata travels with each object through every tier it
        moves to (``Tier.put``)."""
        out: list[bool] = []
        for (key, payload), meta in zip(items, check_metas(items, metas), strict=True):
            if not isinstance(key, ObjectKey):
                raise TypeError(f"key must be an ObjectKey, got {type(key).__name__}")
            why = None if meta is None else meta.check_key(key)
            if why is not None:
                log.warning("metadata does not fit %s: %s", key.to_str(), why)
            out.append(self._valid(payload) and why is None and self._put_one(key, payload, meta))
            if not out[-1]:
                self.mstats.put_failures += 1
        return out

    @staticmethod
    def _valid(payload: torch.Tensor) -> bool:
        """Can the tiers store this payload (contiguous and dense)?"""
        return check_payload(payload) is None

    def _put_one(self, key: ObjectKey, payload: torch.Tensor, meta: ObjectMeta | None = None
                 ) -> bool:
        with self.lock:
            old = self.ledger.remove(key)  # overwrite: the old copy goes first
            placement = self.ledger.place(key, nbytes_of(payload))
            ops, dropped = self._apply(placement)
        results = self._run([*old, *ops], {key: payload}, {key: meta} if meta else None)
        results = results[len(old):]
        with self.lock:
            for op, res in zip(ops, results, strict=True):
                if isinstance(op, Put) and op.key == key:
                    self.ledger.commit(key, res, op.tier == self.ledger.shared_tier)
            ok = self.ledger.where(key) is not None
            dropped += self._settle(ops, results, own=key)
        self.report_dropped(dropped)
        return ok

    def remove(self, keys: Sequence[ObjectKey]) -> None:
        with self.lock:
            ops = [op for k in keys for op in self.ledger.remove(k)]
        self._run(ops)

    # ------------------------------------------------------------------ pins
    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Pin each present key (False: absent). Pins nest; a pinned object is never
        moved or dropped until ``unpin``."""
        with self.lock:
            out = [self.ledger.where(k) is not None for k in keys]
            self.ledger.pin([k for k, ok in zip(keys, out, strict=True) if ok])
        return out

    def unpin(self, keys: Sequence[ObjectKey]) -> None:
        with self.lock:
            self.ledger.pin(keys, -1)

    # ------------------------------------------------------------------ reads
    def _read_one(self, key: ObjectKey, out: torch.Tensor | None) -> torch.Tensor | None:
        with self.lock:
            tier = self.ledger.where(key)
        if tier is None:
            self.mstats.misses += 1
            return None
        data = self.executor.read([key], [tier])[0]
        if data is not None and out is not None:
            if tuple(out.shape) != tuple(data.shape) or out.dtype != data.dtype:
                return None
            out.copy_(data)
            data = out
        ops: list[Op] = []
        dropped: list[ObjectKey] = []
        with self.lock:
            if data is None:
                self.mstats.misses += 1
                if self.executor.holder(key) is None:  # lost, not just unreachable for now
                    ops, dropped = self._apply(self.ledger.lost(key, tier))
            else:
                self.ledger.touch([key])
                if self.promote:
                    ops, dropped = self._apply(self.ledger.promote(key))
        if ops:
            results = self._run(ops)
            with self.lock:
                dropped += self._settle(ops, results)
        self.report_dropped(dropped)
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
                raise Miss(k.to_str())
            return t

        transfers = [LayerTransfer(str(i), fetch=partial(fetch, k)) for i, k in enumerate(keys)]
        return LoadHandle(self._copy.submit_layers(transfers, cancel_on_error=False), keys)

    def get_into_async(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> LoadHandle:
        """Start loading ``keys`` into ``outs`` (device buffers land via the copy stream);
        ``handle.wait(i)`` returns ``outs[i]`` once landed, or None on a miss."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")

        def fetch(k: ObjectKey, dst: torch.Tensor) -> torch.Tensor | None:
            staged = self._read_one(k, None)
            if staged is None or tuple(staged.shape) != tuple(dst.shape) or staged.dtype != dst.dtype:
                raise Miss(k.to_str())
            if dst.device.type == "cpu":
                dst.copy_(staged)
                return None  # filled dst itself
            return staged

        transfers = [LayerTransfer(str(i), dst=o, fetch=partial(fetch, k, o))
                     for i, (k, o) in enumerate(zip(keys, outs, strict=True))]
        return LoadHandle(self._copy.submit_layers(transfers, cancel_on_error=False), keys)

    # ------------------------------------------------------------------ misc
    def stats(self) -> dict[str, Any]:
        """Per-tier ``TierStats`` plus movement counters (a snapshot); ``drops_with_room``:
        evictions dropped while a tier below had room (a defect: always 0)."""
        tiers: dict[str, TierStats] = {t.name: t.stats() for t in self.tiers}
        return {"tiers": tiers, "demotions": dict(self.executor.demotions),
                "promotions": dict(self.executor.promotions), "drops": dict(self.mstats.drops),
                "put_failures": self.mstats.put_failures, "misses": self.mstats.misses,
                "drops_with_room": self.ledger.drops_with_room}

    def close(self) -> None:
        self._copy.close()
        super().close()


def build_store(config: HybridConfig, device: torch.device | str | None = None) -> TieredStore:
    """The store the cache, the server and the CLI use: a ``TieredStore`` over the
    configured tiers."""
    return TieredStore.from_config(config, device=device)
