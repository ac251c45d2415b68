"""The models a server serves: one ``HybridCache`` per model fingerprint over one shared
tiered store, created at the first ``HELLO`` for it.

The index of a model is built with the server's config (tiers, policies, budgets) and the
client's ``CLIENT_KEYS`` (chunk size, hash block, alignment, anchors: they shape what the
client packs and hashes), so its fingerprint is the one the client's embedded cache would
have: a second engine of the same model, or the same engine after a restart, lands on the
same index and hits on what the first stored.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from hybrid_connector import assemble
from hybrid_connector.cache import HybridCache
from hybrid_connector.config import ConfigError, HybridConfig, load_config
from hybrid_connector.model import ModelGeometry
from hybrid_connector.wire.convert import CLIENT_KEYS
from tiers.manager import TierManager


class HelloError(ValueError):
    """A ``HELLO`` the server cannot serve (bad geometry, cache keys it does not accept,
    a model served already under other cache keys); the message says which."""


class Models:
    """Fingerprint -> ``HybridCache``; thread safe. ``close`` detaches every index (the
    store is the server's to close)."""

    def __init__(self, config: HybridConfig, store: TierManager) -> None:
        self.config = config
        self.store = store
        self._by_spec: dict[str, HybridCache] = {}
        self.by_fingerprint: dict[str, HybridCache] = {}
        self.names: dict[str, str] = {}  # fingerprint -> geometry name (for inspect)
        self._lock = threading.Lock()

    def hello(self, geometry: dict[str, Any], layout: dict[str, Any], model_id: str,
              cache_keys: dict[str, Any]) -> HybridCache:
        """The cache for this model, created if new. Raises ``HelloError``."""
        unknown = sorted(set(cache_keys) - set(CLIENT_KEYS))
        if unknown:
            raise HelloError(f"cache keys {unknown} are not client keys ({CLIENT_KEYS})")
        spec = json.dumps([geometry, layout, model_id, cache_keys], sort_keys=True, default=str)
        with self._lock:
            cache = self._by_spec.get(spec)
            if cache is not None:
                return cache
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
            return cache

    def caches(self) -> list[HybridCache]:
        with self._lock:
            return list(self.by_fingerprint.values())

    def close(self) -> None:
        """Wait for every model's queued I/O and detach its index (the store stays open)."""
        for cache in self.caches():
            cache.detach()
