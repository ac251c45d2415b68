"""Remote tier against slow, lying or hostile peers (all real sockets on 127.0.0.1).

A slow reply must end at the call's one deadline without holding up other threads' calls;
a CRC-valid blob with absurd header fields, an announced 2 GiB reply or a Redis-like
server with odd answers must each be a miss, never an exception and never a huge
allocation. Checks count what the peer sent instead of timing the client.
"""

from __future__ import annotations

import os
import resource
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hostile_peers import FakeLm, FakeRedis, TrickleProxy, crafted_blob, zstd_frame_claiming
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers import codec
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.remote.tier import RemoteTier

K = ObjectKind
BIG = {k: 1 << 30 for k in K}


@pytest.fixture(params=["lm", "redis"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def proxy(scheme: str, request: pytest.FixtureRequest) -> Iterator[TrickleProxy]:
    upstream = request.getfixturevalue("lmcache_server" if scheme == "lm" else "redis_server")
    p = TrickleProxy(upstream)
    try:
        yield p
    finally:
        p.close()


def _in_thread(fn: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)  # type: ignore[operator]
    t.start()
    return t, out


# ------------------------------------------------------------------ item 14: deadlines
@pytest.mark.server
@pytest.mark.timeout(60)
def test_slow_reply_ends_at_the_call_deadline_and_blocks_no_other_call(
        scheme: str, proxy: TrickleProxy) -> None:
    """The server's reply to one get trickles in one byte per 20 ms (the whole blob would
    take over a minute): that get must give up at its deadline, and a get of another key
    from another thread must complete meanwhile."""
    tier = RemoteTier(proxy.url(scheme), BIG, timeout=1.0, min_backoff=60)
    slow_k, slow_v = make_key(1, fp=f"slow-{scheme}"), make_payload(1, (1024,))
    fast_k, fast_v = make_key(2, fp=f"slow-{scheme}"), make_payload(2, (1024,))
    assert tier.put([(slow_k, slow_v), (fast_k, fast_v)]) == [True, True]
    blob_len = len(codec.encode_blob(slow_k, slow_v))
    proxy.marker = tier.client.name_for(slow_k).encode()

    slow, slow_out = _in_thread(lambda: tier.get([slow_k]))
    assert proxy.triggered.wait(10), "the slow get never reached the server"
    fast, fast_out = _in_thread(lambda: tier.get([fast_k]))
    fast.join(10)
    assert not fast.is_alive(), "a get waited behind another thread's slow get"
    assert slow.is_alive()  # it could only end by its deadline, which is far longer than this
    assert same_bits(fast_out[0][0], fast_v)  # type: ignore[index]

    slow.join(10)
    assert not slow.is_alive(), "the slow get ignored its deadline"
    assert slow_out == [[None]]
    assert proxy.trickled < blob_len  # it gave up before the reply was complete
    assert tier.contains([slow_k]) == [True]  # unreachable for now is not lost
    tier.close()


def test_rediss_runs_through_deadline_sockets(tmp_path: Path) -> None:
    """rediss://: the deadline wrapper sits on top of the TLS socket and passes its calls
    through unchanged (a real TLS handshake with a self-signed certificate)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    fake = FakeRedis({}, tls=ctx)
    try:
        tier = RemoteTier(fake.url(), BIG, timeout=5)
        k, v = make_key(6, fp="tls"), make_payload(6, (4096,))  # several TLS records
        assert tier.put([(k, v)]) == [True]
        assert same_bits(tier.get([k])[0], v)
        assert tier.healthy() and tier.failures == 0
        tier.close()
    finally:
        fake.close()


# ------------------------------------------------------------------ item 15: hostile data
def _header(k: object, **over: object) -> dict[str, object]:
    h: dict[str, object] = {"key": k.to_str(), "kind": "kv", "shape": [64],  # type: ignore[attr-defined]
                            "dtype": "float32", "nbytes": 256, "stored": 256, "codec": "raw",
                            "checksum": codec.checksum(bytes(256))}
    h.update(over)
    return h


def _crafted(name: str, k: object) -> bytes:
    if name == "nbytes_1e400":
        raw = (b'{"key":"%s","kind":"kv","shape":[64],"dtype":"float32","nbytes":1e400,'
               b'"stored":256,"codec":"raw","checksum":"%s"}'
               % (k.to_str().encode(), codec.checksum(bytes(256)).encode()))  # type: ignore[attr-defined]
        return crafted_blob(raw, bytes(256))
    if name == "nested_60k":
        return crafted_blob(b'{"key":' + b"[" * 60000, bytes(256))
    if name == "frame_claims_1TB":
        frame = zstd_frame_claiming(10**12)
        return crafted_blob(_header(k, codec="zstd", stored=len(frame)), frame)
    raise AssertionError(name)


@pytest.mark.server
@pytest.mark.parametrize("damage", ["nbytes_1e400", "nested_60k", "frame_claims_1TB"])
def test_crafted_blob_with_a_valid_crc_is_a_miss(scheme: str, damage: str,
                                                 request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("lmcache_server" if scheme == "lm" else "redis_server")
    tier = RemoteTier(url, BIG)
    m = TieredStore([tier])
    k, v = make_key(3, fp=f"crafted-{damage}"), make_payload(3, (64,))
    assert m.put([(k, v)]) == [True]
    tier.client.put(tier.client.name_for(k), _crafted(damage, k))  # the server now holds it
    assert m.get([k]) == [None]  # a miss through the manager, never an exception
    assert tier.contains([k]) == [False]  # corrupt: forgotten, so it is never promised again
    assert not tier.is_down  # the server answered; the data was bad
    m.close()


def test_announced_2gib_reply_under_memory_pressure_is_a_miss(tmp_path: object) -> None:
    """A server announces a 2 GiB body for a 256-byte object. In a child whose address
    space is capped (real memory pressure), the get must be a miss: the length is checked
    against the object's bound before anything is allocated."""
    fake = FakeLm(get_length=(1 << 31) - 1)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.close(rfd)
            tier = RemoteTier(fake.url(), BIG, timeout=5)
            k = make_key(4, fp="pressure")
            ok = tier.put([(k, make_payload(4, (64,)))]) == [True]
            with open("/proc/self/status") as fh:
                vm = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmSize:"))
            resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
            try:
                res = "miss" if tier.get([k]) == [None] else "hit"
            except BaseException as exc:  # noqa: BLE001 - report what escaped
                res = type(exc).__name__
            os.write(wfd, f"{int(ok)},{res}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    try:
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("child hung")
        out = os.read(rfd, 100).decode()
    finally:
        os.close(rfd)
        fake.close()
    assert out == "1,miss"


@pytest.mark.parametrize("odd", ["hello_only", "reads_too"])
def test_redis_like_server_answering_hello_with_an_integer(odd: str) -> None:
    """``HELLO`` answered with ``:1`` (and, second case, reads and PING too): the tier
    works where the server is otherwise sane and is a plain miss where it is not."""
    one = b":1\r\n"
    overrides = {b"HELLO": one}
    if odd == "reads_too":
        overrides.update({b"GET": one, b"GETRANGE": one, b"PING": one})
    fake = FakeRedis(overrides)
    try:
        tier = RemoteTier(fake.url(), BIG, timeout=2, min_backoff=0.01, max_backoff=0.01)
        k, v = make_key(5, fp="hello"), make_payload(5, (64,), torch.bfloat16)
        assert tier.put([(k, v)]) == [True]
        if odd == "hello_only":
            assert same_bits(tier.get([k])[0], v)
            assert tier.healthy()
        else:
            assert tier.get([k]) == [None]  # an integer is not a blob
            time.sleep(0.02)  # past the (tiny) backoff: the next call talks to the server
            assert not tier.healthy()
        tier.close()
    finally:
        fake.close()
