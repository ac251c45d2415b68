"""The remote tier on a real 3-master, 3-replica Redis Cluster (``redis+cluster://``), started
on 127.0.0.1 by the ``redis_cluster`` fixture (``cluster_servers``).

Every object kind, dtype and shape round-trips bit for bit through another instance's
client, spread over all three shards; an object over the chunk size is chunked on its own
shard and a torn, partial or damaged one is a miss, never served; MOVED and ASK redirects
(a slot migrated under the client) are followed; an unreachable or stalled cluster is a
miss within the deadline. Failover: ``test_tier_redis_cluster_failover``; two processes:
``test_tier_redis_cluster_cross``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cluster_servers import Cluster
from tier_helpers import DTYPES, make_key, make_payload, same_bits
from tier_servers import StalledServer

from hybrid_connector.core.config import ConfigError, load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.remote import chunks as remote_chunks
from hybrid_connector.tiers.remote.cluster import RedisClusterClient
from hybrid_connector.tiers.remote.tier import RemoteTier, make_client

K = ObjectKind
BIG = {k: 1 << 30 for k in K}
CHUNK = 1 << 20


def raw(c: Cluster):  # type: ignore[no-untyped-def]
    """redis-py's own cluster client (no code of ours), to inspect and damage the store."""
    from redis.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in c.ports])


@pytest.fixture
def tiers(redis_cluster: Cluster) -> Iterator[tuple[RemoteTier, RemoteTier]]:
    """Two instances' tiers on the cluster: a writer and a reader that indexes nothing."""
    a = RemoteTier(redis_cluster.url, BIG, timeout=5, chunk_size=CHUNK)
    b = RemoteTier(redis_cluster.url, BIG, timeout=5, chunk_size=CHUNK)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _items(fp: str, big: bool) -> list[tuple[object, torch.Tensor]]:
    out = [(make_key(100 * j + i, kind, fp=fp), make_payload(i + j, shape, dt))
           for j, kind in enumerate(K)
           for i, (dt, shape) in enumerate((d, s) for d in DTYPES for s in [(3, 5), (), (0,)])]
    out.append((make_key(9000, K.KV, fp=fp), make_payload(1, (150_000,), torch.float32)))  # 0.6 MB
    out.append((make_key(9001, K.STATE, fp=fp), make_payload(2, (1 << 20,), torch.float32)))  # 4 MiB
    if big:  # a 50 MB state: 48 chunks of 1 MiB on one shard
        out.append((make_key(9002, K.STATE, fp=fp), make_payload(3, (25_000_000,), torch.bfloat16)))
    return out


@pytest.mark.server
@pytest.mark.parametrize("serde", ["naive", "zstd"])
def test_every_kind_round_trips_bit_identically_across_shards(
        redis_cluster: Cluster, tiers: tuple[RemoteTier, RemoteTier], serde: str) -> None:
    a = RemoteTier(redis_cluster.url, BIG, timeout=10, chunk_size=CHUNK, serde=serde)
    b = tiers[1]
    its = _items(f"rc-{serde}", big=serde == "naive")
    keys = [k for k, _ in its]
    assert a.put(its) == [True] * len(its)
    # a fresh instance finds, sizes and reads each bit for bit (get and get_into)
    assert b.contains(keys) == [True] * len(keys)
    assert [b.meta(k) for k in keys] == [(tuple(v.shape), v.dtype, v.numel() * v.element_size())
                                         for _, v in its]
    for (_, v), got in zip(its, b.get(keys), strict=True):
        assert same_bits(got, v), (v.dtype, v.shape)
    outs = [torch.empty_like(v) for _, v in its]
    assert b.get_into(keys, outs) == [True] * len(keys)
    assert all(same_bits(o, v) for o, (_, v) in zip(outs, its, strict=True))
    # and the writer reads its own (indexed) objects back
    assert all(same_bits(g, v) for g, (_, v) in zip(a.get(keys), its, strict=True))
    # spread over all three shards; a chunked object's chunks sit on its own shard
    r = raw(redis_cluster)
    names = [a.client.name_for(k) for k in keys]
    masters = {redis_cluster.master_of_slot(r.keyslot(n)) for n in names}
    assert len(masters) == 3
    big = names[-1]
    ptr = remote_chunks.decode_pointer(r.get(big))
    assert ptr is not None and ptr.chunks > 1
    assert {r.keyslot(c) for c in ptr.chunk_names(big)} == {r.keyslot(big)}
    assert all(r.exists(c) for c in ptr.chunk_names(big))
    assert not a.is_down and not b.is_down and b.stats().errors == 0
    a.close()


@pytest.mark.server
def test_torn_partial_or_damaged_chunked_objects_are_misses(
        redis_cluster: Cluster, tiers: tuple[RemoteTier, RemoteTier]) -> None:
    a, _ = tiers
    r = raw(redis_cluster)
    objs = [(make_key(i, K.STATE, fp="torn"), make_payload(i, (700_000,))) for i in range(4)]  # 2.8 MB
    assert a.put(objs) == [True] * 4
    names = [a.client.name_for(k) for k, _ in objs]
    ptrs = [remote_chunks.decode_pointer(r.get(n)) for n in names]
    assert all(p is not None and p.chunks == 3 for p in ptrs)
    r.delete(ptrs[0].chunk_names(names[0])[1])                        # a chunk evicted
    r.setrange(ptrs[1].chunk_names(names[1])[2], 100, b"\xff\x00")    # a chunk damaged
    r.set(ptrs[2].chunk_names(names[2])[1], b"short")                  # a chunk torn
    r.set(names[3], r.get(names[3])[:-1] + b"\x00")                    # the pointer damaged
    fresh = RemoteTier(redis_cluster.url, BIG, timeout=5)
    for tier in (a, fresh):  # indexed here (a) or not (fresh): never served
        assert tier.get([k for k, _ in objs]) == [None] * 4
        outs = [torch.zeros_like(v) for _, v in objs]
        assert tier.get_into([k for k, _ in objs], outs) == [False] * 4
    assert fresh.stats().hits == 0 and not fresh.is_down and not a.is_down
    # put again: a new version with its own chunks, and the old ones unlinked
    again = RemoteTier(redis_cluster.url, BIG, timeout=5, chunk_size=CHUNK)
    assert again.put(objs[:1]) == [True]
    new = remote_chunks.decode_pointer(r.get(names[0]))
    assert new is not None and new.version != ptrs[0].version
    assert not any(r.exists(c) for c in ptrs[0].chunk_names(names[0]))
    assert same_bits(RemoteTier(redis_cluster.url, BIG, timeout=5).get([objs[0][0]])[0], objs[0][1])
    fresh.close()
    again.close()


def _migrate_slot(c: Cluster, slot: int, src: int, dst: int, finish: bool) -> None:
    """Move ``slot``'s keys from master ``src`` to master ``dst`` (redis-cli's reshard
    steps); with ``finish=False`` the slot is left MIGRATING, so its moved keys ASK."""
    sid, did = (c.cli_call(p, "cluster", "myid").strip() for p in (src, dst))
    c.cli_call(dst, "cluster", "setslot", str(slot), "importing", sid)
    c.cli_call(src, "cluster", "setslot", str(slot), "migrating", did)
    keys = c.cli_call(src, "cluster", "getkeysinslot", str(slot), "1000").split()
    if keys:
        c.cli_call(src, "migrate", "127.0.0.1", str(dst), "", "0", "5000", "keys", *keys)
    if finish:
        for p in c.masters():
            c.cli_call(p, "cluster", "setslot", str(slot), "node", did)


@pytest.mark.server
def test_moved_and_ask_redirects_are_followed(redis_cluster: Cluster,
                                              tiers: tuple[RemoteTier, RemoteTier]) -> None:
    a, b = tiers
    r = raw(redis_cluster)
    small, chunked = (make_key(1, K.KV, fp="moved"), make_payload(1, (64,))), \
        (make_key(2, K.STATE, fp="moved"), make_payload(2, (600_000,)))
    for kv in (small, chunked):
        assert a.put([kv]) == [True]
        assert same_bits(b.get([kv[0]])[0], kv[1])  # b's slot map now points at the master
    for kv, finish in ((small, False), (chunked, True)):
        slot = r.keyslot(a.client.name_for(kv[0]))
        src = redis_cluster.master_of_slot(slot)
        dst = next(p for p in redis_cluster.masters() if p != src)
        _migrate_slot(redis_cluster, slot, src, dst, finish)
        # b still sends to src: ASK (mid-migration) or MOVED (done), both followed
        def fresh() -> RemoteTier:
            t = RemoteTier(redis_cluster.url, BIG, timeout=5)
            t.client.close()
            t.client = b.client  # its slot map is stale now
            return t
        assert fresh().contains([kv[0]]) == [True]
        assert same_bits(fresh().get([kv[0]])[0], kv[1]), finish
        assert same_bits(a.get([kv[0]])[0], kv[1])       # indexed read, same redirect
        if not finish:
            _migrate_slot(redis_cluster, slot, src, dst, True)
    assert not a.is_down and not b.is_down
    assert redis_cluster.wait_ok(10) >= 0


@pytest.mark.server
def test_manifests_are_shared_across_instances(tiers: tuple[RemoteTier, RemoteTier]) -> None:
    a, b = tiers
    names = [f"{'c' * 32}.{i:032x}" for i in range(6)]  # spread over the slots
    for i, n in enumerate(names):
        assert a.append_record(n, b"rec-%d" % i) and b.append_record(n, b"more")
    assert [b.records(n) for n in names] == [[b"rec-%d" % i, b"more"] for i in range(6)]


@pytest.mark.server
@pytest.mark.timeout(60)
def test_unreachable_or_stalled_cluster_is_a_miss_within_the_deadline(
        dead_port: int, stalled_server: StalledServer) -> None:
    k, v = make_key(1, fp="gone"), make_payload(1, (8,))
    for url in (f"redis+cluster://127.0.0.1:{dead_port}", f"redis+cluster://{stalled_server.addr}"):
        tier = RemoteTier(url, BIG, timeout=1.0, min_backoff=0.01, max_backoff=0.01)
        for call, args in ((tier.put, [(k, v)]), (tier.contains, [k]), (tier.get, [k]),
                           (tier.records, "a" * 32 + "." + "0" * 32)):
            t0 = time.monotonic()
            assert call(args) in ([False], [None], [])  # type: ignore[operator]
            assert time.monotonic() - t0 < 2.0  # ends before a second deadline would
            time.sleep(0.02)  # past the backoff: the next call touches the network again
        assert not tier.healthy()
        tier.close()
    assert stalled_server.accepted >= 1  # the stalled node was really asked


def test_cluster_urls_are_validated(tmp_path: Path) -> None:
    ok = "redis+cluster://u:p%40ss@10.0.0.1:7000,[::1]:7001,node-c:7002/0"
    c = make_client(ok, 1.0)
    assert isinstance(c, RedisClusterClient)
    assert c.cfg.nodes == (("10.0.0.1", 7000), ("::1", 7001), ("node-c", 7002))
    assert (c.cfg.username, c.cfg.password, c.cfg.tls) == ("u", "p@ss", False)
    assert make_client("valkeys+cluster://h:1", 1.0).cfg.tls  # type: ignore[attr-defined]
    from hybrid_connector.tiers.remote.tier import RedisClient

    assert isinstance(make_client("valkeys://h:1", 1.0), RedisClient)  # one server, TLS
    for bad, msg in [("redis+cluster://", "host:port"), ("redis+cluster://h", "host:port"),
                     ("redis+cluster://h:1,h", "bad node 'h'"), ("redis+cluster://h:0", "host:port"),
                     ("redis+cluster://h:1/3", "database 0"), ("redis+cluster://h:1?x=1", "query"),
                     ("mongo+cluster://h:1", "unsupported scheme")]:
        with pytest.raises(ValueError, match=msg):
            make_client(bad, 1.0)
        with pytest.raises(ConfigError, match="remote_url"):
            load_config(overrides={"remote_url": bad, "pools": {"remote": {"kv": 1}}}, environ={})
    base = {"remote_url": ok, "pools": {"remote": {"kv": 1 << 20}}}
    assert load_config(overrides={**base, "remote_chunk_size": "1MiB"}, environ={}).remote_chunk_size == 1 << 20
    with pytest.raises(ConfigError, match="not a cluster URL"):
        load_config(overrides={**base, "remote_url": "redis://h:1", "remote_chunk_size": "1MiB"},
                    environ={})
    with pytest.raises(ConfigError, match="remote_chunk_size"):
        load_config(overrides={**base, "remote_chunk_size": 10}, environ={})


@pytest.mark.server
@pytest.mark.timeout(60)
def test_concurrent_puts_of_one_key_are_never_spliced(redis_cluster: Cluster) -> None:
    """Two instances keep putting the same chunked objects with different serdes (their
    blobs differ) while readers in threads read them: a reader gets the object bit for bit
    or a miss (a version unlinked under it), never a blob spliced from two puts (which the
    codec would reject: counted as an error)."""
    import threading

    objs = [(make_key(i, K.STATE, fp="race"), make_payload(i, (500_000,))) for i in range(3)]  # 2 MB
    writers = [RemoteTier(redis_cluster.url, BIG, timeout=5, chunk_size=256 << 10, serde=s)
               for s in ("naive", "zstd")]
    readers = [RemoteTier(redis_cluster.url, BIG, timeout=5) for _ in range(3)]
    stop, wrong, hits = threading.Event(), [], [0]

    def write(t: RemoteTier) -> None:
        while not stop.is_set():
            t.remove([k for k, _ in objs])  # forget: the next put writes a new version
            t.put(objs)

    def read(t: RemoteTier) -> None:
        while not stop.is_set():
            for (k, v), got in zip(objs, t.get([k for k, _ in objs]), strict=True):
                if got is not None:
                    hits[0] += 1
                    if not same_bits(got, v):
                        wrong.append(k)

    threads = [threading.Thread(target=write, args=(w,)) for w in writers]
    threads += [threading.Thread(target=read, args=(r,)) for r in readers]
    for th in threads:
        th.start()
    time.sleep(3)
    stop.set()
    for th in threads:
        th.join(10)
    assert not wrong and hits[0] > 0
    assert sum(r.stats().errors for r in readers) == 0  # no splice was ever read
    for t in writers + readers:
        t.close()
