"""``HasherLike.block_ends``: every hasher gives what ``at`` gives at each block end (the
slice ``ObjectMeta.for_range`` takes of an engine's hashes included)."""

import numpy as np
import pytest

from hybrid_connector.core.hashes import ChainHasher, EngineHashes
from hybrid_connector.core.keys import ObjectKind, PrefixHasher
from hybrid_connector.core.meta import ObjectMeta

BS = 4


def _hashers(toks: np.ndarray) -> list:
    eng = EngineHashes(BS, PrefixHasher(toks, BS).blocks, toks)
    return [PrefixHasher(toks, BS), ChainHasher(BS, toks), eng]


@pytest.mark.parametrize("start,end", [(0, 0), (0, 3), (0, 4), (1, 9), (4, 12), (5, 22), (8, 23)])
def test_block_ends_equal_at(start: int, end: int) -> None:
    toks = np.arange(23, dtype=np.int64) % 7
    first = (start // BS + 1) * BS
    for h in _hashers(toks):
        want = tuple(h.at(p) for p in range(first, end + 1, BS))
        assert h.block_ends(first, end) == want
        meta = ObjectMeta.for_range(toks, start, end, ObjectKind.KV, h) if end > start else None
        if meta is not None:
            assert meta.hashes == want and meta.prev == h.at(start)


def test_engine_block_ends_past_its_hashes_raise() -> None:
    eng = EngineHashes(BS, [b"a", b"b"])
    assert eng.block_ends(4, 8) == (b"a", b"b")
    with pytest.raises(ValueError):
        eng.block_ends(4, 12)


def test_engine_hashes_refuse_empty_or_non_bytes() -> None:
    with pytest.raises(ValueError, match="hash 1"):
        EngineHashes(BS, [b"a", b""])
    with pytest.raises(ValueError, match="hash 0"):
        EngineHashes(BS, ["a"])  # type: ignore[list-item]
