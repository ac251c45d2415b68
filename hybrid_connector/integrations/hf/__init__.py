"""transformers runtime: cached prefill and greedy generation for hybrid causal LMs
(``HFRuntime``), and what it needs: reading and writing the model's cache tensors
(``state``, ``pack``), anchors and suffix replay, the trained tiny models, replay quality.

Import the modules themselves (``from hybrid_connector.integrations.hf.runtime import
HFRuntime``): this package imports nothing, so its light modules stay light.
"""
