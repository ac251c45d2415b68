"""``hybrid-connector bench vllm-peers``: this connector against vLLM's own offloading
connectors inside vLLM 0.33's real Scheduler. ``sweep`` runs the traces x budgets x
connectors, ``setups`` builds each connector's ``KVTransferConfig``, ``engine`` and ``run``
drive vLLM's Scheduler, ``runner`` executes its steps with byte checks, ``cpu_copy`` is the
one stand-in (the workers' GPU copy routine), ``buffers`` vLLM's own ``allocate_kv_cache``
views, ``report`` the table and plot, ``cli`` the subcommand."""
