"""The token-prefix hash chain the deterministic "model" of the head-to-head's runner and of
the test harness is a function of: ``chain[t]`` identifies ``tokens[:t]``."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def prefix_hash(chain: list[bytes], tokens: Sequence[int], t: int) -> bytes:
    """``chain[t]``, extending ``chain`` in place as far as ``t``: ``chain[i + 1]`` is the
    16-byte BLAKE2b of ``chain[i]`` and token ``i`` (8 bytes, little-endian); ``chain[0]`` is
    the caller's seed. A prefix of the chain stays valid while ``tokens`` only grows."""
    while len(chain) <= t:
        i = len(chain) - 1
        chain.append(hashlib.blake2b(chain[-1] + tokens[i].to_bytes(8, "little"),
                                     digest_size=16).digest())
    return chain[t]
