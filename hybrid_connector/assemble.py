"""The composition root: every entry point (demo, simulator, transformers runtime, engine
integrations, cache server) builds its policies, stores, indexes and caches here, from one
validated config. Nothing below this module imports a factory: the index receives its
policies, the policies receive the alpha tuner's replayer.

* ``policies(config)``: eviction (with the size-only tuner caches of
  ``runtime.tuner_caches`` for ``alpha: auto``) and admission.
* ``store(config)``: the ``ObjectStore`` the config's tiers make (a ``TieredStore``).
* ``cache(config, geometry)``: an embedded ``HybridCache`` (index + this process's bytes).
* ``engine_cache(config, geometry)``: what an engine integration uses: the embedded cache,
  or a ``ServerCache`` when the config names a ``cache_server`` (server mode by
  configuration alone).
* ``index(config, geometry, backend)``: an index alone, for a process whose bytes live
  elsewhere (a vLLM scheduler, the cache server's front).
"""

from __future__ import annotations

import torch

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.state import Policies
from hybrid_connector.policies import build
from hybrid_connector.policies.base import AdmissionPolicy, EvictionPolicy
from hybrid_connector.remote.client.server_cache import ServerCache
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.runtime.tuner_caches import default_replayer_factory, default_shadow_factory
from hybrid_connector.tiers.backend import Backend
from hybrid_connector.tiers.manager import build_store
from hybrid_connector.tiers.store import ObjectStore


def policies(config: HybridConfig, eviction: EvictionPolicy | None = None,
             admission: AdmissionPolicy | None = None) -> Policies:
    """The configured policies; ``eviction``/``admission`` override one of them."""
    return Policies(eviction or build.eviction(config, default_replayer_factory,
                                                 default_shadow_factory),
                    admission or build.admission(config))


def store(config: HybridConfig, device: torch.device | str | None = None) -> ObjectStore:
    """The tiers the config describes (device, host, NVMe, remote), in this process."""
    return build_store(config, device=device)


def cache(config: HybridConfig, geometry: ModelGeometry, backend: ObjectStore | None = None, *,
          eviction: EvictionPolicy | None = None, admission: AdmissionPolicy | None = None,
          layout: dict[str, object] | None = None, model_id: str = "") -> HybridCache:
    """An embedded cache over the ``ObjectStore`` ``backend`` (default: the config's tiers)."""
    return HybridCache(config, geometry, backend if backend is not None else store(config),
                       policies(config, eviction, admission), layout=layout, model_id=model_id)


EngineCache = HybridCache | ServerCache


def engine_cache(config: HybridConfig, geometry: ModelGeometry,
                 backend: ObjectStore | None = None,
                 *, eviction: EvictionPolicy | None = None,
                 admission: AdmissionPolicy | None = None,
                 layout: dict[str, object] | None = None, model_id: str = "") -> EngineCache:
    """``cache`` (embedded), or a ``ServerCache`` when ``config.cache_server`` is set; then
    the index, policies and tiers are the server's, and passing ``backend`` or policy
    overrides is a ValueError (they would be silently ignored)."""
    if config.cache_server is None:
        return cache(config, geometry, backend, eviction=eviction, admission=admission,
                     layout=layout, model_id=model_id)
    if backend is not None or eviction is not None or admission is not None:
        raise ValueError("cache_server is set: the tiers and policies are the server's; "
                         "do not pass a store or policy overrides")
    return ServerCache(config, geometry, layout=layout, model_id=model_id)


def index(config: HybridConfig, geometry: ModelGeometry, backend: Backend, *,
          eviction: EvictionPolicy | None = None, admission: AdmissionPolicy | None = None,
          layout: dict[str, object] | None = None, model_id: str = "") -> CacheIndex:
    """An index alone over ``backend``, a store's ledger half (an ``ObjectStore``, or a bare
    ``Backend`` when the bytes live in another process: its ops run wherever they are)."""
    return CacheIndex(config, geometry, backend, policies(config, eviction, admission),
                      layout=layout, model_id=model_id)
