"""Remote tier against real servers: lmcache_server (lm://) and redis-server (redis://).

The servers are started by fixtures on 127.0.0.1 (skipped when the binary is missing,
failed instead when CI=true).
"""

from __future__ import annotations

import socket
import struct

import pytest
import torch
from tier_helpers import DTYPES, make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers import lm_protocol
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.remote.tier import LmClient, RemoteTier, make_client

K = ObjectKind


@pytest.fixture(params=["lm", "redis"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("lmcache_server" if request.param == "lm" else "redis_server"))


@pytest.mark.server
@pytest.mark.parametrize("serde", ["naive", "zstd"])
def test_round_trip_every_dtype(url: str, serde: str) -> None:
    tier = RemoteTier(url, {k: 1 << 24 for k in K}, serde=serde)
    items = [(make_key(1000 + i, K.STATE, fp=f"rt-{serde}"), make_payload(i, shape, dt))
             for i, (dt, shape) in enumerate((d, s) for d in DTYPES for s in [(3, 5), (), (0,)])]
    assert all(tier.put(items))
    for (k, v), got in zip(items, tier.get([k for k, _ in items]), strict=True):
        assert same_bits(got, v), (k, v.dtype, v.shape)
    outs = [torch.empty_like(v) for _, v in items]
    assert all(tier.get_into([k for k, _ in items], outs))
    assert all(same_bits(o, v) for o, (_, v) in zip(outs, items, strict=True))
    assert tier.healthy() and not tier.is_down
    tier.close()


@pytest.mark.server
def test_large_object_and_budget(url: str) -> None:
    tier = RemoteTier(url, {K.KV: 3 << 20})
    big = make_payload(5, (1 << 20,), torch.bfloat16)  # 2 MiB
    k1, k2 = make_key(1, fp="big"), make_key(2, fp="big")
    assert tier.put([(k1, big), (k2, big)]) == [True, False]  # budget enforced locally
    assert same_bits(tier.get([k1])[0], big)
    # remove forgets locally (the budget is free again) but deletes nothing shared
    assert tier.remove([k1]) == [True] and tier.held_keys() == [] and tier.used(K.KV) == 0
    assert tier.put([(k2, big)]) == [True]
    assert same_bits(tier.get([k1])[0], big)  # still on the server, found there again
    assert tier.held_keys() == [k2]  # found, not indexed: outside the budget
    tier.close()


@pytest.mark.server
def test_manager_demotes_into_remote_and_promotes_back(url: str) -> None:
    host = HostTier({K.KV: 1024})
    remote = RemoteTier(url, {K.KV: 1 << 20})
    m = TieredStore([host, remote])
    items = [(make_key(i, fp=f"mgr-{url[:2]}"), make_payload(i, (64,))) for i in range(10)]
    assert all(m.put(items))
    assert m.where([items[0][0]]) == ["remote"]
    assert same_bits(m.get([items[0][0]])[0], items[0][1])
    assert m.where([items[0][0]]) == ["host"]  # promoted
    for k, v in items:
        assert same_bits(m.get([k])[0], v)
    m.close()


@pytest.mark.server
def test_wire_format_matches_lmcache_protocol(lmcache_server: str) -> None:
    """Our packed headers equal lmcache 0.5.6's own ClientMetaMessage bytes, and its own
    deserializer reads our replies' layout."""
    protocol = pytest.importorskip("lmcache.v1.protocol")
    from lmcache.utils import parse_cache_key
    from lmcache.v1.memory_management import MemoryFormat

    key = lm_protocol.key_string(make_key(3).digest())
    for cmd, length in [(lm_protocol.Command.PUT, 1234), (lm_protocol.Command.GET, 0)]:
        theirs = protocol.ClientMetaMessage(
            protocol.ClientCommand(int(cmd)), parse_cache_key(key), length,
            MemoryFormat.BINARY, torch.uint8,
            torch.Size([length, 0, 0, 0] if cmd is lm_protocol.Command.PUT else [0, 0, 0, 0]),
        ).serialize()
        assert lm_protocol.request(cmd, key, length) == theirs
    reply = protocol.ServerMetaMessage(protocol.ServerReturnCode.SUCCESS, 77, MemoryFormat.BINARY,
                                       torch.uint8, torch.Size([77, 0, 0, 0])).serialize()
    assert lm_protocol.parse_reply(reply) == (200, 77)
    # and the live server answers our raw client
    u = lmcache_server.removeprefix("lm://").split(":")
    c = LmClient(u[0], int(u[1]), timeout=5)
    c.health()
    c.put(key, b"\x00\x01payload")
    assert c.exists(key) and c.get(key, 100) == b"\x00\x01payload"
    assert c.get(lm_protocol.key_string("ab" * 20), 100) is None
    c.close()


@pytest.mark.server
def test_lmcache_own_client_reads_what_we_wrote(lmcache_server: str) -> None:
    """Interop: a raw LMCache-protocol socket (no code of ours) fetches our blob."""
    tier = RemoteTier(lmcache_server, {K.KV: 1 << 20})
    k, v = make_key(42, fp="interop"), make_payload(42, (8, 8), torch.bfloat16)
    assert tier.put([(k, v)]) == [True]
    host, port = lmcache_server.removeprefix("lm://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        name = lm_protocol.key_string(k.digest(), lm_protocol.kind_model(k.kind.value)).encode().ljust(150)
        s.sendall(struct.pack("iiiiiiiii150s", 2, 0, 4, 6, 0, 0, 0, 0, 0, name))
        head = s.recv(36, socket.MSG_WAITALL)
        code, length = struct.unpack("iiiiiiiii", head)[:2]
        blob = bytearray()
        while len(blob) < length:
            blob += s.recv(length - len(blob))
    assert code == 200
    from hybrid_connector.tiers.codec import decode_blob

    assert same_bits(decode_blob(k, bytes(blob)), v)
    tier.close()


def test_bad_urls() -> None:
    with pytest.raises(ValueError, match="unsupported scheme"):
        make_client("http://x:1", 1.0)
    with pytest.raises(ValueError, match="lm://host:port"):
        make_client("lm://nohost", 1.0)
    with pytest.raises(ValueError, match="serde"):
        RemoteTier("lm://127.0.0.1:1", {}, serde="cachegen")




@pytest.mark.server
def test_object_lost_by_the_server_is_reported_dropped(redis_server: str) -> None:
    import redis

    m = TieredStore([RemoteTier(redis_server, {K.STATE: 1 << 20})])
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    k, v = make_key(7, K.STATE, fp="lost"), make_payload(7, (32,))
    assert m.put([(k, v)]) == [True]
    redis.Redis.from_url(redis_server).delete("hc:" + k.digest())  # e.g. a server restart
    assert m.get([k]) == [None]
    assert dropped == [k] and m.where([k]) == [None]
    m.close()
