"""vLLM 0.33 KV connector for hybrid models. vLLM loads it by this package's path::

    --kv-transfer-config '{"kv_connector": "HybridConnector",
      "kv_connector_module_path": "hybrid_connector.integrations.vllm", "kv_role": "kv_both", ...}'

``connector`` is the facade vLLM instantiates; ``scheduler`` and ``worker`` are its two
sides, ``setup``, ``pages``, ``meta`` and ``stats`` what they share.
"""

from hybrid_connector.integrations.vllm.connector import HybridConnector, HybridStartupError

__all__ = ["HybridConnector", "HybridStartupError"]
