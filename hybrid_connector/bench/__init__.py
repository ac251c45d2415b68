"""Benchmarks that ship with the package (the ``hybrid-connector bench`` command).

``capacity``: the working set of a multi-session workload against a device budget it does
not fit in, through real tiers (device pool, host, NVMe) with real bytes, one module per
concept: ``schema`` (the validated config), ``workload`` (traces), ``objects`` (scaled
geometry, payloads, verification), ``setups`` (the configurations compared),
``runner`` (one configuration at one budget), ``compute`` (modeled and real prefill),
``peers`` (LMCache's own backends), ``report`` (table, JSON, PNG), ``capacity`` (the sweep)
and ``cli``.
"""
