"""Tiered object store: per-kind pools on device, host, NVMe and remote tiers.

``ObjectStore`` (``store``) is the one store interface (the ledger half an index stores through,
``backend.Backend``, plus batch-first object calls); ``TieredStore`` (``manager``) implements it
over this process's tiers, ``MemoryStore`` (``memory``) is the one-tier instance and
``manager.build_store(config)`` builds one from a ``HybridConfig``.

Modules: ``tier`` (the ``Tier`` interface), ``indexed`` (``IndexedTier``, the bookkeeping
the concrete tiers share), ``slab`` (preallocated slab + per-kind arena allocator),
``device``/``host`` (slab tiers), ``nvme`` (one file per object, atomic writes,
checksummed), ``remote`` (``lm://`` and ``redis://``), ``nixl`` (optional NIXL data path),
``codec`` (self-describing checksummed serialisation), ``lm_protocol`` (lmcache_server wire
format), ``manager`` (``TieredStore``: placement, demotion, promotion, pins, async loads), ``copy_engine``
(layer-wise async copies).
"""
