"""SGLang 0.5.23 HiCache L3 storage backend for hybrid models. SGLang loads it by this
package's path (``--hicache-storage-backend dynamic`` with
``"module_path": "hybrid_connector.integrations.sglang", "class_name": "HybridHiCacheStorage"``).

``backend`` is the class SGLang builds; ``keys``, ``pages`` and ``chain`` hold what needs no
SGLang import (page-hash keys, page checks, FLOP-aware eviction order).
"""

from hybrid_connector.integrations.sglang.backend import HybridHiCacheStorage

__all__ = ["HybridHiCacheStorage"]
