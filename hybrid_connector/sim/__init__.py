"""Policy simulator: trace formats and generators, a size-only store, the replay loop
through the real ``HybridCache``, baselines, and the ``simulate``/``gen-trace`` CLI."""
