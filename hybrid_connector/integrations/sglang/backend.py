"""SGLang 0.5.23 HiCache L3 storage backend for hybrid models: the KV pool and the MAMBA
pool stored in this project's tiers (host, NVMe, remote), each kind in its own pool.

Load it as SGLang's ``dynamic`` backend::

    --enable-hierarchical-cache --hicache-mem-layout page_first \
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \
    '{"backend_name": "hybrid", "module_path": "hybrid_connector.integrations.sglang",
      "class_name": "HybridHiCacheStorage", "config_file": "configs/sglang-qwen3_5.yaml",
      "hicache_storage_pass_prefix_keys": true}'

(``overrides``, a mapping, may add ``load_config`` overrides.) This is the only module
that imports SGLang.

Design: a direct keyed path, not the radix index. SGLang's storage calls carry page
hashes and host-pool indices, never token ids (``prefix_keys`` only when SGLang is told to
pass them), so ``CacheIndex``, whose radix tree and hit rule are over tokens, cannot be
driven from them. Instead every page is an object of the tier store (``assemble.store``:
the ``ObjectStore`` over the config's tiers) keyed by its page hash
(``sglang_keys.PageKeys``, no rehashing); SGLang's own radix tree stays the index. What
our store adds over SGLang's file backend:

* states live in their own pool (``pools.<tier>.state``), sized in bytes of states and
  never a fraction of KV: KV pressure cannot evict a state, so a prefix's KV is never left
  as dead memory behind an evicted state (SGLang #29034, #39436, #39851); and when the
  store drops a KV page on its own, the state keyed by that page (which needs it) goes
  with it;
* eviction per pool across tiers (the ledger's least recently used order, demoting to the
  slower tier before dropping), payload checksums on NVMe, and a remote tier shared by
  instances: pages another instance of the same model and rank stored there are found
  (one batched existence check) and adopted;
* the host-pool layout is part of the key fingerprint (SGLang's file backend keys bytes
  without it), so pages written in one layout never load into another.

Eviction: the tier ledger's per-pool LRU order by default. With ``tier_eviction: value``
(and ``model:`` naming the geometry) and SGLang passing ``prefix_keys``
(``"hicache_storage_pass_prefix_keys": true`` in its extra config), the chain of page
hashes each call names gives every page its depth and parent, and eviction turns FLOP
aware as in Marconi: value per byte from the prefill FLOPs a page or state saves, KV pages
counted per stored state at or below them, and those with none (part of no L3 hit) first
(``sglang_chain``; measured in ``benchmarks/sglang_eviction.py``).

Errors never reach SGLang: any failure is logged and answered as a miss (``False`` per
page, a zero hit), as SGLang's own backends do. Host indices and page sizes are checked
before anything moves (``sglang_pages``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from enum import Enum
from functools import partial
from typing import Any, TypeVar

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from hybrid_connector import assemble
from hybrid_connector.core.config import HybridConfig, load_config
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.geometry.presets import load_geometry
from hybrid_connector.integrations.sglang.chain import ChainValue, PageChain
from hybrid_connector.integrations.sglang.keys import (
    KV_POOL,
    MAMBA_POOL,
    PageKeys,
    leading,
    restorable_prefixes,
)
from hybrid_connector.integrations.sglang.pages import PageSpec, held_fits, page_starts
from hybrid_connector.policies.eviction.tier_value import TierValue
from hybrid_connector.tiers.store import ObjectStore, StoreHooks

log = logging.getLogger(__name__)
T = TypeVar("T")
PageFn = Callable[[ObjectKey, Any, int, PageSpec], bool]  # key, host pool, first slot, page


def _name(value: object) -> str:
    """The string of a ``PoolName``/``PoolHitPolicy`` (or of a plain string)."""
    return str(value.value) if isinstance(value, Enum) else str(value)


def _config(storage_config: HiCacheStorageConfig) -> HybridConfig:
    """The config named by the extra config, with ``local_disk`` narrowed to this rank's
    own directory (one NVMe tier instance per directory; every rank process has its own)."""
    extra = dict(storage_config.extra_config or {})
    overrides = extra.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ValueError(f"extra_config.overrides must be a mapping, got {overrides!r}")
    config = load_config(extra.get("config_file"), overrides=overrides)
    if config.local_disk:
        sc = storage_config
        sub = (f"{config.disk_path}/tp{sc.tp_rank}_{sc.tp_size}_pp{sc.pp_rank}_{sc.pp_size}"
               f"_cp{sc.attn_cp_rank}_{sc.attn_cp_size}_dp{sc.dp_rank}")
        config = load_config(extra.get("config_file"), overrides={**overrides, "local_disk": sub})
    return config


class HybridHiCacheStorage(HiCacheStorage):
    """``HiCacheStorage`` over this project's tiers (see the module docstring).

    ``HybridHiCacheStorage(storage_config, kwargs)`` is how SGLang's ``dynamic`` factory
    builds it; ``store`` (tests, embedding) replaces the store the config describes.
    Served: ``batch_exists_v2``/``batch_get_v2``/``batch_set_v2`` for the KV and MAMBA pools
    (other pools are misses), the v1 KV calls, and the legacy ``get``/``set``/``exists``.
    Raises ValueError/``ConfigError`` at construction for a bad config; never afterwards.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None, *,
                 store: ObjectStore | None = None) -> None:
        self.storage_config = storage_config
        self.config = _config(storage_config)
        self.store = store if store is not None else assemble.store(self.config, device="cpu")
        self.registered_pools: dict[str, Any] = {}
        self._page_size = int(storage_config.logical_page_size or 0)
        self._keys: PageKeys | None = None
        self.chain = PageChain()  # depths and parents from SGLang's prefix_keys
        self._value: TierValue | None = None
        if self.config.tier_eviction == "value":
            if not self.config.model:
                raise ValueError("tier_eviction: value needs `model:` (a preset or geometry "
                                 "YAML) to price pages in FLOPs")
            self._value = TierValue.from_config(
                load_geometry(self.config.model, tp_size=max(1, storage_config.tp_size or 1)),
                self.config)

    # ------------------------------------------------------------------ pools
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The KV host pool (SGLang's anchor pool); it fixes the page size of the keys."""
        super().register_mem_pool_host(mem_pool_host)
        self.registered_pools.setdefault(KV_POOL, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A pool of the v2 calls, by ``PoolName``."""
        self.registered_pools[_name(host_pool_name)] = host_pool

    @property
    def keys(self) -> PageKeys:
        """Key maker. Kept once the KV host pool is registered (its page size and layout
        are part of the fingerprints); before that, built from the storage config alone."""
        if self._keys is not None:
            return self._keys
        sc = self.storage_config
        kv = self.registered_pools.get(KV_POOL)
        page = int(getattr(kv, "page_size", 0) or self._page_size or 1)
        layout = str(getattr(kv, "layout", "page_first" if sc.is_page_first_layout
                             else "layer_first"))
        # DP groups hold the same shards (tp_rank is attention-group local): not in keys.
        shard = {"tp_rank": sc.tp_rank, "tp_size": sc.tp_size, "pp_rank": sc.pp_rank,
                 "pp_size": sc.pp_size, "cp_rank": sc.attn_cp_rank, "cp_size": sc.attn_cp_size}
        keys = PageKeys(sc.model_name or "", page, layout, shard, kv_replicated=sc.is_mla_model)
        if kv is None:
            return keys
        self._keys = keys
        value = (None if self._value is None else
                 ChainValue(self.chain, self._value, page, keys.fingerprints.values()))
        try:
            self.store.attach(keys.fingerprints[KV_POOL],
                              StoreHooks(on_drop=self._kv_dropped, tier_value=value))
            self.store.attach(keys.fingerprints[MAMBA_POOL],
                              StoreHooks(on_drop=self._states_dropped, tier_value=value))
        except ValueError as e:  # another backend of this rank's KV on the same store
            log.warning("%s; states whose last KV page is dropped stay until evicted", e)
        if value is not None:
            with self.store.lock:
                self.store.ledger.value_window = self.config.tier_value_window
        return keys

    def _kv_dropped(self, keys: Sequence[ObjectKey]) -> None:
        """The store dropped KV pages on its own: the states at the end of those pages can
        never be restored, so they go too (no dead state memory)."""
        keys_ = self.keys
        kv = [k for k in keys if k.kind is ObjectKind.KV]
        self.chain.dropped(ObjectKind.KV, [k.prefix for k in kv])
        states = [keys_.state_of(k) for k in kv]
        self._safe("drop", lambda: self.store.remove(states), None)
        self.chain.dropped(ObjectKind.STATE, [k.prefix for k in states])

    def _states_dropped(self, keys: Sequence[ObjectKey]) -> None:
        self.chain.dropped(ObjectKind.STATE, [k.prefix for k in keys])

    def _learn(self, extra_info: HiCacheStorageExtraInfo | None, hashes: Sequence[str]) -> None:
        """Record the chain ``prefix_keys + hashes`` names (when SGLang passes it), with
        FLOP-aware eviction on only: the chain serves nothing else, and learning costs a
        pass over the whole prefix per call (unlearned pages leave ``stored``/``dropped``
        dictionary misses)."""
        prefix = getattr(extra_info, "prefix_keys", None)
        if prefix is not None and self._value is not None:
            self._safe("learn", lambda: self.chain.learn(list(prefix), list(hashes)), None)

    # ------------------------------------------------------------------ safety
    def _safe(self, what: str, fn: Callable[[], T], miss: T) -> T:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - SGLang must see a miss, never an exception
            log.exception("HybridHiCacheStorage.%s failed; answering a miss", what)
            return miss

    def _present(self, pool: str, hashes: Sequence[str]) -> list[bool]:
        """Which pages this store holds; on a shared (remote) tier, pages other instances
        of this model and rank wrote are found too and tracked from then on."""
        if not self.keys.supports(pool):
            return [False] * len(hashes)
        keys = [self.keys.key(pool, h) for h in hashes]
        found = [t is not None for t in self.store.where(keys)]
        if not all(found) and self.store.ledger.shared_tier is not None:
            self._discover(pool, keys, found)
        return found

    def _discover(self, pool: str, keys: list[ObjectKey], found: list[bool]) -> None:
        """Ask the shared tier (one batched existence check, its deadline) about the keys
        not found, and adopt those it holds as shared-only entries (``found`` updated)."""
        host = self.registered_pools.get(pool)
        shared = self.store.ledger.shared_tier
        if host is None or shared is None or self.store.executor is None:
            return
        nbytes = PageSpec.of(host).nbytes
        ask = [i for i, ok in enumerate(found) if not ok]
        held = self.store.executor.tiers[shared].contains([keys[i] for i in ask])
        dropped: list[ObjectKey] = []
        for i, there in zip(ask, held, strict=True):
            if there:
                with self.store.lock:
                    placement = self.store.ledger.adopt_shared(keys[i], nbytes)
                dropped += placement.dropped
                found[i] = placement.tier is not None
        self.store.report_dropped(dropped)

    # ------------------------------------------------------------------ v2
    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info: HiCacheStorageExtraInfo | None = None) -> PoolTransferResult:
        """SGLang's contract: the usable prefix (pages) over the KV pool and each extra
        pool's hit policy, per-pool boundaries and every restorable length."""
        def run() -> PoolTransferResult:
            self._learn(extra_info, keys)
            kv = self._present(KV_POOL, keys)
            run_len = leading(kv)
            extra = [(_name(t.name), _name(t.hit_policy), len(t.keys or ()),
                      self._present(_name(t.name), keys[:run_len])) for t in pool_transfers or ()]
            pages, hits, order = restorable_prefixes(kv, extra)
            return PoolTransferResult(pages, hits, order)
        return self._safe("batch_exists_v2", run, PoolTransferResult(0, {}, []))

    def _io(self, transfers: list[PoolTransfer], page_fn: PageFn,
            what: str) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for t in transfers:
            name, hashes = _name(t.name), list(t.keys or [])
            out[name] = self._safe(what, partial(self._pool_io, name, hashes, t.host_indices,
                                                 page_fn), [False] * len(hashes))
        return out

    def _pool_io(self, name: str, hashes: list[str], host_indices: torch.Tensor | None,
                 page_fn: PageFn) -> list[bool]:
        """``page_fn`` per page, once the transfer's indices are all valid for its pool
        (``page_starts``); otherwise every page is False and nothing moves."""
        pool = self.registered_pools.get(name)
        if pool is None or not self.keys.supports(name):
            log.warning("pool %r is not registered or not stored; its pages are misses", name)
            return [False] * len(hashes)
        starts = page_starts(pool, len(hashes), host_indices)
        if isinstance(starts, str):
            log.warning("pool %r: %s; its %d pages are refused", name, starts, len(hashes))
            return [False] * len(hashes)
        spec = PageSpec.of(pool)
        return [self._safe(name, partial(self._page, page_fn, name, h, pool, i, spec), False)
                for h, i in zip(hashes, starts, strict=True)]

    def _page(self, page_fn: PageFn, name: str, page_hash: str, pool: Any, index: int,
              spec: PageSpec) -> bool:
        return page_fn(self.keys.key(name, page_hash), pool, index, spec)

    def _read(self, key: ObjectKey, pool: Any, index: int, spec: PageSpec) -> bool:
        buf = pool.get_dummy_flat_data_page()
        if not self.store.get_into([key], [buf])[0]:
            return False
        pool.set_from_flat_data_page(index, buf)
        return True

    def _write(self, key: ObjectKey, pool: Any, index: int, spec: PageSpec) -> bool:
        if held_fits(self.store, key, spec):  # same hash, same bytes: refresh only
            with self.store.lock:
                self.store.ledger.touch([key])
            ok = True
        else:  # absent, or held with another size: (re)written
            page = pool.get_data_page(index, flat=True).contiguous()
            if not spec.fits(page):  # a pool whose pages differ from its own dummy page
                raise ValueError(f"page at {index}: {page.numel()} {page.dtype}, not {spec}")
            ok = self.store.put([(key, page)])[0]
        if ok:
            self.chain.stored(key.kind, [key.prefix])
        return ok

    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        """Load each transfer's pages into its host pool at ``host_indices``; per page True
        when loaded (a page of another shape or layout is a miss)."""
        return self._io(transfers, self._read, "batch_get_v2")

    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> dict[str, list[bool]]:
        """Store each transfer's host pages; per page True when stored (or already held).
        With ``prefix_keys`` in ``extra_info``, each transfer's chain is learned first."""
        for t in transfers:
            self._learn(extra_info, t.keys or [])
        return self._io(transfers, self._write, "batch_set_v2")

    # ------------------------------------------------------------------ v1 (KV only)
    def _kv(self, keys: list[str], host_indices: torch.Tensor) -> list[PoolTransfer]:
        return [PoolTransfer(name=PoolName.KV, host_indices=host_indices, keys=list(keys))]

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """KV pages into the KV host pool (``batch_get_v2`` of one KV transfer)."""
        return self.batch_get_v2(self._kv(keys, host_indices), extra_info).get(
            KV_POOL, [False] * len(keys))

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """KV pages from the KV host pool (``batch_set_v2`` of one KV transfer)."""
        return self.batch_set_v2(self._kv(keys, host_indices), extra_info).get(
            KV_POOL, [False] * len(keys))

    # ------------------------------------------------------------------ legacy (KV keys)
    def get(self, key: str, target_location: Any = None,
            target_sizes: Any = None) -> torch.Tensor | None:
        """Read ``key`` into ``target_location`` (a tensor of the stored shape and dtype)."""
        def run() -> torch.Tensor | None:
            if not isinstance(target_location, torch.Tensor):
                return None
            ok = self.store.get_into([self.keys.key(KV_POOL, key)], [target_location])[0]
            return target_location if ok else None
        return self._safe("get", run, None)

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        targets = list(target_locations or [None] * len(keys))
        return [self.get(k, t) for k, t in zip(keys, targets, strict=False)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        """Store ``value`` under ``key`` as a flat page of the KV host pool (replacing what
        is held); False, nothing stored, unless it has that registered pool's page bytes."""
        def run() -> bool:
            kv = self.registered_pools.get(KV_POOL)
            spec = None if kv is None else PageSpec.of(kv)
            page = spec.coerce(value) if spec and isinstance(value, torch.Tensor) else None
            if page is None:
                log.warning("set(%r): not a page of the registered KV host pool", key)
                return False
            return self.store.put([(self.keys.key(KV_POOL, key), page)])[0]
        return self._safe("set", run, False)

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        vals = list(values or [])
        return len(vals) == len(keys) and all([self.set(k, v) for k, v in zip(keys, vals,
                                                                              strict=True)])

    def batch_exists(self, keys: list[str],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """Leading run of KV pages held (one batched lookup); learns the chain."""
        def run() -> int:
            self._learn(extra_info, keys)
            return leading(self._present(KV_POOL, keys))
        return self._safe("batch_exists", run, 0)

    def exists(self, key: str) -> bool:
        return self._safe("exists", lambda: self._present(KV_POOL, [key])[0], False)

    # ------------------------------------------------------------------ lifecycle
    def clear(self) -> None:
        """Forget every object of this rank's fingerprints (other models keep theirs).
        Copies on a shared tier stay there (the remote tier never deletes: other instances
        read them), so later lookups may find them again."""
        def run() -> None:
            fps = set(self.keys.fingerprints.values())
            self.store.remove([k for kind in ObjectKind for k in self.store.keys(kind)
                               if k.fingerprint in fps])
            self.chain.clear()
        self._safe("clear", run, None)

    def get_stats(self) -> Any:
        """None: SGLang then logs its own ``StorageMetrics`` (a dict here would break its
        metrics collector); the tier counters are ``self.store.stats()``."""
        return None

    def close(self) -> None:
        self._safe("close", self.store.close, None)
