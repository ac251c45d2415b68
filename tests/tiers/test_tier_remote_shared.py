"""The remote tier shared across instances (issue 10 item 4), against real servers.

Two cache instances in two processes (a ``multiprocessing`` spawn child, see
``remote_peer``) share one ``redis-server`` or ``lmcache_server``: each finds the other's
objects through ``contains`` and reads them bit for bit; ``remove`` in one deletes nothing
the other reads; manifest records appended by one are listed by the other; concurrent
appends on Redis lose nothing and on lm:// never corrupt. A server that is down or
stalled answers False / [] within the deadline, and hostile manifests are refused.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hostile_peers import FakeLm, crafted_blob
from remote_peer import BIG, Peer, append_records, items
from tier_helpers import make_key, make_payload, same_bits
from tier_servers import StalledServer

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers import codec, manifest
from hybrid_connector.tiers.executor import Executor
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manifest import Limits
from hybrid_connector.tiers.remote.tier import LmClient, RemoteTier

K = ObjectKind


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(params=["lm", "redis"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("lmcache_server" if request.param == "lm" else "redis_server"))


@pytest.mark.server
@pytest.mark.parametrize("serde", ["naive", "zstd"])
def test_other_process_objects_found_and_read_bit_identically(url: str, serde: str,
                                                              peer: Peer) -> None:
    """The peer puts every dtype and shape, then removes them all (forgetting locally
    only); this process, which never put them, finds each through ``contains``, sizes it
    through ``meta`` and reads it bit identically through ``get`` and ``get_into``."""
    fp = f"peer-{serde}-{url[:2]}"
    its = items(fp)
    assert peer.call("put_objects", url, fp, serde, True) == [True] * (2 * len(its))
    tier = RemoteTier(url, BIG, timeout=5)
    keys = [k for k, _ in its]
    absent = make_key(999, fp=fp)
    assert tier.contains(keys + [absent]) == [True] * len(keys) + [False]
    assert [tier.meta(k) for k in keys] == [
        (tuple(v.shape), v.dtype, v.numel() * v.element_size()) for _, v in its]
    for (_, v), got in zip(its, tier.get(keys), strict=True):
        assert same_bits(got, v), (v.dtype, v.shape)
    outs = [torch.empty_like(v) for _, v in its]
    assert tier.get_into(keys, outs) == [True] * len(keys)
    assert all(same_bits(o, v) for o, (_, v) in zip(outs, its, strict=True))
    # found, not put here: outside the budget and the local index, never pinned
    assert tier.held_keys() == [] and tier.used(K.KV) == 0
    assert tier.pin(keys[:1]) == [True] and tier.pin_count(keys[0]) == 0
    assert tier.get([absent]) == [None] and tier.meta(absent) is None
    assert tier.stats().hits == 2 * len(keys) and not tier.is_down
    # an executor reading a key no tier indexed finds it on the shared tier
    ex = Executor([HostTier(BIG), tier], shared="remote", inline=True)
    assert same_bits(ex.read([keys[1]])[0], its[1][1])
    ex.close()


@pytest.mark.server
def test_objects_put_here_are_read_by_the_other_process(url: str, peer: Peer) -> None:
    """The other direction, and ``remove`` here leaves them readable there."""
    fp = f"here-{url[:2]}"
    its = items(fp)
    tier = RemoteTier(url, BIG, timeout=5)
    assert all(tier.put(its))
    assert tier.remove([k for k, _ in its]) == [True] * len(its)
    assert tier.held_keys() == [] and tier.used(K.KV) == 0  # forgotten here
    assert peer.call("read_objects", url, fp) == [True] * len(its)
    tier.close()


@pytest.mark.server
def test_records_appended_by_one_are_listed_by_the_other(url: str, peer: Peer) -> None:
    name = f"fp-records-{url[:2]}"
    tier = RemoteTier(url, BIG, timeout=5)
    assert tier.records(name) == []  # never appended: empty, not an error
    assert peer.call("append_records", url, name, b"peer-", 3) == [True] * 3
    assert tier.records(name) == [b"peer-0", b"peer-1", b"peer-2"]
    assert tier.append_record(name, b"here") and tier.append_record(name, b"")
    assert peer.call("list_records", url, name) == [b"peer-0", b"peer-1", b"peer-2", b"here", b""]
    assert not tier.is_down
    tier.close()


@pytest.mark.server
def test_concurrent_appends_from_two_processes(url: str, peer: Peer) -> None:
    """Both processes append 200 records to one manifest, each pausing halfway until it
    sees one of the other's, so the two sequences overlap. Redis (atomic RPUSH) loses
    none; lm:// (read-modify-write) may lose some, never corrupts: the list stays
    readable and holds only appended records, in each writer's order."""
    name, n = f"fp-concurrent-{url[:2]}", 200
    peer.start("append_records", url, name, b"p", n, b"h")
    mine = append_records(url, name, b"h", n, b"p")
    theirs = peer.result()
    assert all(mine) and all(theirs)
    got = RemoteTier(url, BIG, timeout=5).records(name)
    ours, peers = [r for r in got if r[:1] == b"h"], [r for r in got if r[:1] == b"p"]
    assert len(ours) + len(peers) == len(got)  # nothing else, nothing garbled
    for sub in (ours, peers):
        idx = [int(r[1:]) for r in sub]
        assert idx == sorted(set(idx)) and set(idx) <= set(range(n))  # each writer's order
    if url.startswith("redis"):
        assert len(ours) == len(peers) == n  # nothing lost
        assert sum(a[:1] != b[:1] for a, b in zip(got, got[1:], strict=False)) >= 2  # overlapped
    else:  # the last PUT was some writer's last append; records may be lost, never garbled
        assert got[-1] in (b"h%d" % (n - 1), b"p%d" % (n - 1))


@pytest.mark.server
def test_manifest_is_bounded_and_never_collides_with_objects(url: str) -> None:
    """Newest ``max_records`` kept; an oversized record is refused; a manifest named like
    an object's digest leaves the object intact (reserved key spaces)."""
    tier = RemoteTier(url, BIG, timeout=5, limits=Limits(max_records=4, max_record_bytes=8))
    k, v = make_key(5, fp=f"collide-{url[:2]}"), make_payload(5, (16,), torch.bfloat16)
    assert tier.put([(k, v)]) == [True]
    name = k.digest()
    assert all(tier.append_record(name, b"r%d" % i) for i in range(6))
    assert tier.append_record(name, b"x" * 9) is False  # over max_record_bytes
    assert tier.records(name) == [b"r2", b"r3", b"r4", b"r5"]
    assert same_bits(tier.get([k])[0], v) and not tier.is_down
    other = RemoteTier(url, BIG, timeout=5)  # a fresh instance reads the object, too
    assert same_bits(other.get([k])[0], v)
    with pytest.raises(ValueError, match="manifest name"):
        tier.append_record("has space", b"r")
    with pytest.raises(ValueError, match="manifest name"):
        tier.records("a@b")
    tier.close()
    other.close()


@pytest.mark.server
def test_corrupt_object_of_another_instance_is_quarantined(url: str) -> None:
    """The server claims an object whose blob is damaged: a miss, then not claimed again
    (though the server still has it) until this process puts a good copy."""
    writer, reader = RemoteTier(url, BIG, timeout=5), RemoteTier(url, BIG, timeout=5)
    k, v = make_key(6, K.STATE, fp=f"quarantine-{url[:2]}"), make_payload(6, (64,))
    blob = codec.encode_blob(k, v)
    name = writer.client.name_for(k)
    writer.client.put(name, blob[:-1] + bytes([blob[-1] ^ 1]))
    assert writer.client.exists(name)  # lm:// does not ack a PUT: wait until it is stored
    assert reader.contains([k]) == [True]  # the server has something under the name
    assert reader.get([k]) == [None]  # its checksum fails
    assert reader.contains([k]) == [False] and reader.meta(k) is None
    assert reader.put([(k, v)]) == [True]
    assert reader.contains([k]) == [True] and same_bits(reader.get([k])[0], v)
    # a caller's wrong buffer is a miss, not a remote failure nor a corrupt object, also
    # where the read its size bounds is cut short (Redis) or refused (lm://)
    big_k, big_v = make_key(8, fp=f"quarantine-{url[:2]}"), make_payload(8, (1 << 16,))
    assert reader.put([(big_k, big_v)]) == [True]
    assert writer.get_into([k, big_k], [torch.empty(3), torch.empty(3)]) == [False, False]
    assert same_bits(writer.get([k])[0], v) and same_bits(writer.get([big_k])[0], big_v)
    assert not writer.is_down and not reader.is_down
    writer.close()
    reader.close()


@pytest.mark.server
def test_contains_batches_many_keys_and_skips_kinds_not_stored(url: str) -> None:
    writer = RemoteTier(url, BIG, timeout=5)
    keys = [make_key(i, fp=f"batch-{url[:2]}") for i in range(300)]
    assert all(writer.put([(k, make_payload(0, (2,))) for k in keys[::3]]))
    reader = RemoteTier(url, BIG, timeout=5)
    assert reader.contains(keys) == [i % 3 == 0 for i in range(300)]  # > one EXIST window
    state = make_key(1, K.STATE, fp=f"batch-{url[:2]}")
    assert writer.put([(state, make_payload(1, (2,)))]) == [True]
    assert RemoteTier(url, {K.KV: 1 << 20}).contains([state]) == [False]  # kind not stored
    writer.close()
    reader.close()


# ------------------------------------------------------------------ down, stalled, hostile
@pytest.mark.parametrize("scheme", ["lm", "redis"])
@pytest.mark.timeout(30)  # only to turn a hang into a failure, not a timing check
def test_stalled_server_gives_false_and_empty_within_the_deadline(
        scheme: str, stalled_server: StalledServer) -> None:
    url = f"{scheme}://{stalled_server.addr}" + ("/0" if scheme == "redis" else "")
    tier = RemoteTier(url, BIG, timeout=0.3, min_backoff=60)
    k = make_key(1, fp="stalled")
    assert tier.records("fp") == []  # this one waits out its deadline
    assert tier.append_record("fp", b"r") is False
    assert tier.contains([k, make_key(2, fp="stalled")]) == [False, False]
    assert tier.meta(k) is None and tier.get([k]) == [None]
    assert tier.get_into([k], [torch.empty(2)]) == [False]
    # one call reached the server and timed out; the backoff answered the rest
    assert tier.failures == 1 and stalled_server.accepted == 1 and tier.is_down


@pytest.mark.parametrize("scheme", ["lm", "redis"])
def test_dead_server_gives_false_and_empty(scheme: str, dead_port: int) -> None:
    url = f"{scheme}://127.0.0.1:{dead_port}" + ("/0" if scheme == "redis" else "")
    tier = RemoteTier(url, BIG, timeout=0.5, min_backoff=0.0, max_backoff=0.0)
    k = make_key(1, fp="dead")
    for _ in range(2):  # no backoff: every call tries the network and fails
        assert tier.contains([k]) == [False] and tier.records("fp") == []
        assert tier.append_record("fp", b"r") is False and tier.get([k]) == [None]
    assert tier.failures == 8


def _lm_manifest(name: str, body: bytes) -> bytes:
    """A manifest blob with a valid CRC around hand-made fields."""
    import struct
    import zlib

    nb = name.encode()
    raw = manifest.MAGIC + struct.pack("<H", len(nb)) + nb + body
    return raw + struct.pack("<I", zlib.crc32(raw))


@pytest.mark.server
@pytest.mark.parametrize("damage", ["record_2gib", "count_huge", "not_a_manifest"])
def test_hostile_lm_manifest_is_refused(lmcache_server: str, damage: str) -> None:
    tier = RemoteTier(lmcache_server, BIG, timeout=5)
    name = f"hostile-{damage}"
    blob = {"record_2gib": _lm_manifest(name, b"\x01\x00\x00\x00" + b"\xff\xff\xff\x7f" + b"ab"),
            "count_huge": _lm_manifest(name, b"\xff\xff\xff\xff"),
            "not_a_manifest": crafted_blob({"x": 1}, b"junk")}[damage]
    tier.client.put(LmClient.manifest_key(name), blob)
    assert tier.records(name) == []  # refused before any allocation of the claimed size
    assert not tier.is_down  # the server answered; the data was bad
    assert tier.append_record(name, b"fresh")  # unreadable for all: replaced
    assert tier.records(name) == [b"fresh"]
    tier.close()


def test_lm_manifest_announced_2gib_is_refused_unread() -> None:
    fake = FakeLm(get_length=(1 << 31) - 1)
    try:
        tier = RemoteTier(fake.url(), BIG, timeout=5)
        assert tier.records("fp") == []
        assert tier.append_record("fp", b"r") is False  # can't read it: left alone
        assert not tier.is_down
        tier.close()
    finally:
        fake.close()


@pytest.mark.server
def test_hostile_redis_manifest_is_refused(redis_server: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_server)
    tier = RemoteTier(redis_server, BIG, timeout=5, limits=Limits(max_records=8, max_record_bytes=16))
    r.rpush(manifest.redis_key("hostile"), b"ok", b"x" * (1 << 20), b"ok2")
    assert tier.records("hostile") == [b"ok", b"ok2"]  # the oversized record is skipped
    r.set(manifest.redis_key("wrongtype"), b"a string, not a list")
    assert tier.records("wrongtype") == [] and tier.append_record("wrongtype", b"r") is False
    assert not tier.is_down
    tier.close()
