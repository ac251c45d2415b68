"""vLLM 0.33.0's own KV buffers on CPU: the harness uses the benchmark's module
(``hybrid_connector.bench.vllm_peers.buffers``, shared with ``hybrid-connector bench vllm-peers``)."""

from hybrid_connector.bench.vllm_peers.buffers import (  # noqa: F401
    BACKENDS,
    StandInLayer,
    allocate,
    backend_class,
    backing,
    bind_backend,
    hybrid_layouts,
    kv_planes,
    state_views,
)
