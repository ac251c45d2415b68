"""``RankGather.inventory``: after a restart each rank reports what its persistent tiers
kept; the index adopts only what every rank holds in the same tier and removes the rest
from the ranks that hold it (ranks never diverge from the ledger)."""

from __future__ import annotations

from cache_support import TINY, config

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.runtime.ranks import RankGather
from hybrid_connector.tiers.backend import Backend
from hybrid_connector.tiers.ledger.ledger import TierSpec
from hybrid_connector.tiers.ops import Remove


def test_only_what_every_rank_holds_is_adopted_the_rest_removed() -> None:
    spec = TierSpec.per_kind("nvme", {ObjectKind.KV: 10**6, ObjectKind.STATE: 10**6}, slow=True)
    ix = assemble.index(config(), TINY, Backend([spec]))
    gather = RankGather(ix, 2)
    k = [ObjectKey(ix.fingerprint, bytes([i + 1]) * 16, ObjectKind.KV, 0, 8) for i in range(3)]
    assert gather.inventory(0, [(k[0], 128, None, "nvme"), (k[1], 128, None, "nvme")]) is None
    got = gather.inventory(1, [(k[0], 128, None, "nvme"), (k[2], 128, None, "nvme")])
    assert got is not None
    with ix.backend.lock:
        assert ix.ledger.where(k[0]) == "nvme"           # held by both ranks: adopted
        assert ix.ledger.where(k[1]) is None and ix.ledger.where(k[2]) is None
    removes = {(op.key, op.tier) for op in ix.drain() if isinstance(op, Remove)}
    assert removes == {(k[1], "nvme"), (k[2], "nvme")}   # strays leave every rank
