"""Objects saved while the remote tier backs off (a real ``redis-server`` or
``lmcache_server``, SIGSTOPped) have
only their host copy; when the host pool later fills, they must go down to the remote once
it is back, never be dropped while it has room (hardening item 11).

The outage is forced, not raced: the server is stopped, a health call times out so the
tier backs off, the objects are put, the server resumes, and the test waits (generous
deadline) until the tier answers again before filling the host.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from tier_helpers import make_key, make_payload, same_bits
from tier_servers import hang, run_lmcache, run_redis

from hybrid_connector import assemble
from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.plan import SaveItem
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.ledger.ledger import Ledger, TierSpec
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.ops import Move, Put, Remove
from hybrid_connector.tiers.remote.tier import RemoteTier

SHAPE = (64,)  # 256 bytes of float32
HOST = {ObjectKind.KV: 4 * 256}  # four objects
REMOTE = {ObjectKind.KV: 1 << 30}
HEALTHY_S = 60.0  # generous: a busy 2-core machine


@contextmanager
def stopped(url: str) -> Iterator[None]:
    """The server we started at ``url`` SIGSTOPped (it accepts, never answers) until exit;
    entered once every thread of it is stopped (``hang``): right after ``kill`` its
    threads may still answer (seen on a loaded host: ``healthy()`` was True)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    pid = next(p.pid for p in psutil.Process().children(recursive=True)
               if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                      for c in p.net_connections("tcp")))
    hang(pid)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_healthy(remote: RemoteTier) -> None:
    deadline = time.monotonic() + HEALTHY_S
    while not remote.healthy():
        assert time.monotonic() < deadline, "the remote never came back"
        time.sleep(0.1)


def items(first: int, n: int) -> list[tuple[ObjectKey, object]]:
    return [(make_key(i), make_payload(i, SHAPE)) for i in range(first, first + n)]


def test_ledger_moves_a_victim_without_a_shared_copy_to_the_shared_tier() -> None:
    """On metadata alone: a host victim whose shared put failed is moved to the shared
    tier (room there), one with a copy is removed from the host; nothing is dropped."""
    led = Ledger([TierSpec.per_kind("host", {ObjectKind.KV: 20}),
                  TierSpec.per_kind("remote", {ObjectKind.KV: 100}, slow=True, shared=True)])
    a, b, c = make_key(1), make_key(2), make_key(3)
    for k, copied in ((a, True), (b, False)):
        led.place(k, 10)
        led.commit(k, True)
        led.commit(k, copied, shared=True)  # b: the remote was down
    pl = led.place(c, 20)
    assert pl.dropped == ()
    assert pl.ops == (Remove(a, "host"), Move(b, "host", "remote"), Put(c, "host"),
                      Put(c, "remote"))
    assert led.where(a) == led.where(b) == "remote"
    led.check()
    assert led.drops_with_room == 0


@pytest.mark.parametrize("server", ["redis", "lmcache"])
def test_objects_saved_during_backoff_are_demoted_not_dropped(tmp_path: Path, server: str) -> None:
    """Hardening item 11, through a ``TieredStore`` over a host tier and a real server."""
    with (run_redis if server == "redis" else run_lmcache)(tmp_path) as url:
        remote = RemoteTier(url, REMOTE, timeout=0.5, min_backoff=1.0, max_backoff=1.0)
        m = TieredStore([HostTier(HOST), remote])
        dropped: list[ObjectKey] = []
        m.set_drop_listener(dropped.extend)
        try:
            early = items(0, 4)
            assert all(m.put(early))  # host and remote copies
            assert all(m.put(items(10, 2)))  # two of ``early`` leave the host: remote-only
            with stopped(url):
                assert not remote.healthy()  # times out: the tier backs off
                during = items(20, 2)
                assert all(m.put(during))  # acknowledged: the host copy; the remote put failed
            wait_healthy(remote)
            # promotions of the remote-only objects fill the host: ``during`` must go down
            for k, v in early[:2]:
                assert same_bits(m.get([k])[0], v)
            assert all(m.put(items(30, 4)))
            m.executor.flush()
            assert not dropped, f"dropped while the remote had room: {dropped}"
            assert m.where([k for k, _ in during]) == ["remote", "remote"]
            for k, v in during:
                assert same_bits(remote.get([k])[0], v)  # the remote's own copy
                assert same_bits(m.get([k])[0], v)
            with m.lock:
                m.ledger.check()
            assert m.stats()["drops_with_room"] == 0
        finally:
            m.close()


# A tiny hybrid: KV 32 B/token, a 96 B checkpoint.
GEO = ModelGeometry.from_dict({
    "name": "tiny", "architecture": "qwen3_5_text", "hidden_size": 8, "vocab_size": 64,
    "layers": ["gdn+mlp", "attention+mlp"],
    "attention": {"num_heads": 2, "num_kv_heads": 2, "head_dim": 4},
    "gdn": {"num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 2, "head_v_dim": 4,
            "conv_kernel": 5},
    "mlp": {"intermediate_size": 16},
})
CHUNK = 8


def request(seed: int) -> tuple[np.ndarray, list[SaveItem]]:
    """16 tokens, their two KV chunks and two checkpoints, with payloads unique to them."""
    toks = np.random.default_rng(seed).integers(0, 64, 16)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for kind, start, end in ((ObjectKind.KV, 0, 8), (ObjectKind.KV, 8, 16),
                             (ObjectKind.STATE, 8, 8), (ObjectKind.STATE, 16, 16)):
        n = (end - start) * GEO.kv_bytes_per_token() if kind is ObjectKind.KV else GEO.state_bytes()
        out.append(SaveItem(kind, start, end, torch.randint(0, 256, (n,), generator=gen,
                                                            dtype=torch.uint8)))
    return toks, out


def test_cache_keeps_what_it_saved_during_backoff(tmp_path: Path) -> None:
    """Hardening item 11 through ``HybridCache``: a request saved while the remote backed
    off is still a full hit, loaded bit-identical, after the host pool filled up."""
    cfg = load_config(overrides={"chunk_size": CHUNK, "hash_block_size": 4, "alignment": 8},
                      environ={})
    kv, st = 16 * GEO.kv_bytes_per_token(), 2 * GEO.state_bytes()  # one request each
    with run_redis(tmp_path) as url:
        remote = RemoteTier(url, REMOTE | {ObjectKind.STATE: 1 << 30}, timeout=0.5,
                            min_backoff=1.0, max_backoff=1.0)
        store = TieredStore([HostTier({ObjectKind.KV: 2 * kv, ObjectKind.STATE: 2 * st}),
                             remote])
        cache = assemble.cache(cfg, GEO, store)
        try:
            assert cache.save(*request(0)).stored == 4
            with stopped(url):
                assert not remote.healthy()
                toks, saved = request(1)
                assert cache.save(toks, saved).stored == 4  # acknowledged: host copies only
            wait_healthy(remote)
            for seed in (2, 3, 4):  # fill the host: request 1 must go down to the remote
                assert cache.save(*request(seed)).stored == 4
            cache.flush()
            cache.check_integrity()
            plan = cache.lookup(np.append(toks, 0))
            assert plan.num_tokens == 16 and {o.tier for o in plan.objects} == {"remote"}
            lease = cache.acquire(plan)
            try:
                got = cache.load(plan)
            finally:
                cache.release(lease)
            assert not got.failed and got.state is not None
            assert [bytes(t.numpy()) for t in got.kv] == [bytes(i.payload.numpy()) for i in saved[:2]]
            assert bytes(got.state.numpy()) == bytes(saved[3].payload.numpy())
        finally:
            cache.close()
