"""Policy simulator: trace formats and generators, trace replay through the real
``HybridCache`` (``runtime.simulator.Simulator`` over ``tiers.size_only.SizeOnlyStore``),
baselines, and the ``simulate``/``gen-trace`` CLI."""
