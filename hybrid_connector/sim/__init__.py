"""Trace formats, generators, baselines and the policy simulator."""
