"""The other direction for tests/tiers/test_tier_redis_cluster_cross.py: a fresh cache
instance in its own process (host tier + the shared remote) serves one prompt, checking
byte for byte every object it loads (``cross_peer.serve``), and writes its hit length.

    python cross_peer_read.py URL OUT TOKEN,TOKEN,...
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from cross_peer import GEO, config, serve

from hybrid_connector import assemble


def main(url: str, out: str, tokens: str) -> None:
    cache = assemble.cache(config(url), GEO)
    assert not cache.index.where  # knows nothing of its own
    hit = serve(cache, np.array([int(t) for t in tokens.split(",")], dtype=np.int64))
    cache.flush()
    cache.close()
    Path(out).write_text(str(hit))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
