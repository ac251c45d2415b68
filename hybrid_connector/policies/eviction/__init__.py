"""Eviction: which node or object leaves first (LRU, Marconi, per-tier value)."""
