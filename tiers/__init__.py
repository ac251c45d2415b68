"""Tiered object store: per-kind pools on device, host, NVMe and remote tiers.

``ObjectStore`` (``tiers.store``) is the batch-first interface ``HybridCache`` talks to;
``MemoryStore`` is the simplest implementation, ``TierManager`` the tiered one.
"""
