"""Tiered object store: per-kind pools on device, host, NVMe and remote tiers.

``ObjectStore`` (``hybrid_connector.tiers.store``) is the batch-first interface ``HybridCache`` talks to;
``MemoryStore`` is the simplest implementation, ``TierManager`` the tiered one and
``hybrid_connector.tiers.manager.build_store(config)`` builds it from a ``HybridConfig``.

Modules: ``tier`` (the ``Tier`` interface), ``indexed`` (``IndexedTier``, the bookkeeping
the concrete tiers share), ``slab`` (preallocated slab + per-kind arena allocator),
``device``/``host`` (slab tiers), ``nvme`` (one file per object, atomic writes,
checksummed), ``remote`` (``lm://`` and ``redis://``), ``nixl`` (optional NIXL data path),
``codec`` (self-describing checksummed serialisation), ``lm_protocol`` (lmcache_server wire
format), ``manager`` (placement, demotion, promotion, pins, async loads), ``copy_engine``
(layer-wise async copies).
"""
