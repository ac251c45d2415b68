"""hybrid-connector: prefix cache and offload connector for hybrid (attention + recurrent) LLMs.

The core (config, model geometry, keys, radix index, the ``HybridCache`` facade) imports
without any engine; integrations live in ``hybrid_connector.integrations``.
"""

__version__ = "0.1.0"
