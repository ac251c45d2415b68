"""Hostile chunk pointers on a real Redis Cluster (``redis_cluster`` fixture): a pointer
anyone can write under ``hc:{digest}`` (CRC-valid, claiming millions or 2**32 - 1 chunks)
costs a reader, and a writer replacing it, a few commands and kilobytes: nothing is built
for the chunks it claims (``hybrid_connector.tiers.remote.chunks``). Before the fix a 3-million-chunk
pointer cost every read and every put over it about 280 MB of chunk names and 8-10 s.
"""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from cluster_servers import Cluster
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.remote import chunks as remote_chunks
from hybrid_connector.tiers.remote.chunks import MIN_CHUNK, Pointer, decode_pointer
from hybrid_connector.tiers.remote.tier import RemoteTier

BIG = {k: 1 << 30 for k in ObjectKind}
PEAK = 16 << 20  # the put's own 400 KB object and its chunks fit many times over


def raw(c: Cluster) -> Any:
    """redis-py's own cluster client, to write what no tier of ours writes."""
    from redis.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in c.ports])


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the most Python memory traced while it ran."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_chunk_names_are_lazy() -> None:
    ptr = Pointer(b"\x01" * 8, 0xFFFF_FFFF, 0xFFFF_FFFF * MIN_CHUNK, MIN_CHUNK)
    assert decode_pointer(ptr.encode()) == ptr
    names, peak = _peak(lambda: ptr.chunk_names("hc:{x}"))
    assert peak < 1 << 20
    assert len(names) == 0xFFFF_FFFF
    assert names[0] == "hc:{x}:0101010101010101:0" and names[-1].endswith(":4294967294")
    assert names[2:4] == ["hc:{x}:0101010101010101:2", "hc:{x}:0101010101010101:3"]
    with pytest.raises(IndexError):
        names[0xFFFF_FFFF]  # noqa: B018
    # a chunk size no writer uses (below the config's least) is no pointer
    assert decode_pointer(Pointer(b"\x01" * 8, 3, 3 * 64, 64).encode()) is None


@pytest.mark.server
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("chunks", "size"), [
    (3_000_000, MIN_CHUNK),    # 196 GB claimed: over the reader's bound, refused
    (0xFFFF_FFFF, MIN_CHUNK),  # the most the field holds
    (3_000_000, 64),           # 192 MB claimed, within the bound: a chunk size no writer uses
], ids=["3M", "4G", "3M-tiny-chunks"])
def test_a_hostile_pointer_is_a_cheap_miss_and_a_put_replaces_it(
        redis_cluster: Cluster, chunks: int, size: int) -> None:
    key = make_key(chunks % 1000 + size, ObjectKind.STATE, fp="hostile-ptr")
    value = make_payload(7, (100_000,))  # 400 KB: two chunks of 256 KiB
    reader = RemoteTier(redis_cluster.url, BIG, timeout=5)
    writer = RemoteTier(redis_cluster.url, BIG, timeout=5, chunk_size=256 << 10)
    try:
        name = reader.client.name_for(key)
        r = raw(redis_cluster)
        r.set(name, Pointer(os.urandom(8), chunks, chunks * size, size).encode())
        assert reader.contains([key]) == [True]  # it is there; reading it is another thing
        # a fresh reader: the header read (meta), a get and a get_into are misses
        for call in (lambda: reader.meta(key), lambda: reader.get([key])[0],
                     lambda: reader.get_into([key], [torch.zeros_like(value)])[0]):
            got, peak = _peak(call)
            assert got in (None, False) and peak < PEAK, peak
        assert not reader.is_down
        # a put over it replaces it (its claimed chunks neither listed nor unlinked)
        ok, peak = _peak(lambda: writer.put([(key, value)]))
        assert ok == [True] and peak < PEAK, peak
        ptr = decode_pointer(r.get(name))
        assert ptr is not None and ptr.chunks == 2 and ptr.chunk_size == 256 << 10
        fresh = RemoteTier(redis_cluster.url, BIG, timeout=5)
        assert same_bits(fresh.get([key])[0], value)
        fresh.close()
    finally:
        reader.close()
        writer.close()


@pytest.mark.server
def test_a_put_unlinks_a_large_old_version_in_batches(redis_cluster: Cluster) -> None:
    """The old version's chunks are unlinked however many there are (lazily named, in
    batches): 2 000 real chunks of ``MIN_CHUNK``."""
    key, value = make_key(1, ObjectKind.STATE, fp="many-chunks"), make_payload(3, (100_000,))
    writer = RemoteTier(redis_cluster.url, BIG, timeout=10, chunk_size=256 << 10)
    try:
        name = writer.client.name_for(key)
        r = raw(redis_cluster)
        old = Pointer(os.urandom(8), 2000, 2000 * MIN_CHUNK, MIN_CHUNK)
        names = old.chunk_names(name)
        p = r.pipeline(transaction=False)
        for n in names:
            p.set(n, b"x")
        p.execute()
        r.set(name, old.encode())
        assert writer.put([(key, value)]) == [True]
        assert sum(r.exists(*names[i:i + 500]) for i in range(0, 2000, 500)) == 0
        assert remote_chunks.decode_pointer(r.get(name)).version != old.version  # type: ignore[union-attr]
    finally:
        writer.close()
