"""Admission, eviction, alpha tuning, sparse placement and anchor retention policies."""
