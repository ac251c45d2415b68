"""The models a server serves: one ``HybridCache`` per model fingerprint over one shared
tiered store, created at the first ``HELLO`` for it.

The index of a model is built with the server's config (tiers, policies, budgets) and the
client's ``CLIENT_KEYS`` (chunk size, hash block, alignment, anchors: they shape what the
client packs and hashes), so its fingerprint is the one the client's embedded cache would
have: a second engine of the same model, or the same engine after a restart, lands on the
same index and hits on what the first stored.

At most ``server.max_models`` indexes exist at once (each costs memory whether or not it
holds anything). Every connection bound to a model counts as a user (``hello`` adds one,
``release`` takes it back). When a new model needs a place at the cap, every index with no
user that holds nothing (no object, no save in flight, no lease) is freed; until then an
unused index stays, so its counters stay in ``STATS`` and a returning client does not pay
for a new index (which scans the tiers' inventory). A ``HELLO`` for a new model when every
place is taken by a used or non-empty index is refused (``ModelsFull``).

Each model's auto-alpha tuner runs as the server's config says: by default bounded
(``shadow_deterministic: false``, ``shadow_cpu_share: 0.2``). A deterministic tuner makes a
``finish`` wait for the twin caches every 10 requests with the model's index lock held,
stalling every client of the model (``benchmarks/tuner_cost.py``: 137 ms p99 against under
1 ms), for a determinism that concurrent clients rule out anyway.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

from hybrid_connector import assemble
from hybrid_connector.core.config import ConfigError, HybridConfig, load_config
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.remote.wire.convert import CLIENT_KEYS
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.tiers.store import ObjectStore


class HelloError(ValueError):
    """A ``HELLO`` the server cannot serve (bad geometry, cache keys it does not accept,
    a model served already under other cache keys); the message says which."""


class ModelsFull(HelloError):
    """A new model beyond ``server.max_models`` while every index is in use or holds
    objects."""


class Models:
    """Fingerprint -> ``HybridCache``, bounded (see the module docstring); thread safe.
    ``close`` detaches every index (the store is the server's to close)."""

    def __init__(self, config: HybridConfig, store: ObjectStore) -> None:
        self.config = config
        self.store = store
        self._by_spec: dict[str, HybridCache] = {}
        self.by_fingerprint: dict[str, HybridCache] = {}
        self.names: dict[str, str] = {}  # fingerprint -> geometry name (for inspect)
        self.users: Counter[str] = Counter()  # fingerprint -> connections bound to it
        self.limit = config.server.max_models
        self.freed = 0  # indexes freed since start
        self._lock = threading.Lock()

    def hello(self, geometry: dict[str, Any], layout: dict[str, Any], model_id: str,
              cache_keys: dict[str, Any]) -> HybridCache:
        """The cache for this model, created if new, with one more user (give it back
        with ``release``). Raises ``HelloError`` (``ModelsFull`` at the cap)."""
        unknown = sorted(set(cache_keys) - set(CLIENT_KEYS))
        if unknown:
            raise HelloError(f"cache keys {unknown} are not client keys ({CLIENT_KEYS})")
        spec = json.dumps([geometry, layout, model_id, cache_keys], sort_keys=True, default=str)
        with self._lock:
            cache = self._by_spec.get(spec)
            if cache is not None:
                self.users[cache.fingerprint] += 1
                return cache
            if len(self._by_spec) >= self.limit:
                for fp in [f for f in self.by_fingerprint if not self.users[f]]:
                    self._free_if_empty(fp)
            if len(self._by_spec) >= self.limit:
                raise ModelsFull(f"the server serves server.max_models ({self.limit}) models "
                                 "already, each in use or holding objects: try again later")
            try:
                geo = ModelGeometry.from_dict(geometry, source="HELLO geometry")
                cfg = load_config(overrides={**self.config.explicit(), **cache_keys},
                                  environ={})
            except (ConfigError, ValueError, TypeError) as exc:
                raise HelloError(str(exc)) from None
            try:
                cache = assemble.cache(cfg, geo, self.store, layout=layout, model_id=model_id)
            except ValueError as exc:  # the fingerprint is attached under other cache keys
                raise HelloError(f"{exc} (with different cache keys: "
                                 f"{ {k: getattr(cfg, k) for k in CLIENT_KEYS} })") from None
            self._by_spec[spec] = cache
            self.by_fingerprint[cache.fingerprint] = cache
            self.names[cache.fingerprint] = geo.name
            self.users[cache.fingerprint] += 1
            return cache

    def release(self, cache: HybridCache) -> None:
        """One user of ``cache`` is gone (an unused index may be freed for a new model)."""
        with self._lock:
            fp = cache.fingerprint
            self.users[fp] -= 1
            if self.users[fp] <= 0:
                del self.users[fp]

    def _free_if_empty(self, fp: str) -> None:
        """Detach and forget the unused index of ``fp`` if it holds nothing (lock held)."""
        cache = self.by_fingerprint.get(fp)
        if cache is None or self.users[fp]:
            return
        ix = cache.index
        with ix.lock:
            if ix.where or ix.pending or ix.leases or ix.doomed:
                return
        del self.by_fingerprint[fp]
        self.names.pop(fp, None)
        for spec in [s for s, c in self._by_spec.items() if c is cache]:
            del self._by_spec[spec]
        cache.detach()
        self.freed += 1

    def caches(self) -> list[HybridCache]:
        with self._lock:
            return list(self.by_fingerprint.values())

    def close(self) -> None:
        """Wait for every model's queued I/O and detach its index (the store stays open)."""
        for cache in self.caches():
            cache.detach()
