"""Objects saved while the remote tier backs off (a real ``redis-server``, SIGSTOPped) have
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

import redis
from tier_helpers import make_key, make_payload, same_bits
from tier_servers import run_redis

from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers.host import HostTier
from tiers.ledger import Ledger, TierSpec
from tiers.manager import TierManager
from tiers.ops import Move, Put, Remove
from tiers.remote import RemoteTier

SHAPE = (64,)  # 256 bytes of float32
HOST = {ObjectKind.KV: 4 * 256}  # four objects
REMOTE = {ObjectKind.KV: 1 << 30}
HEALTHY_S = 60.0  # generous: a busy 2-core machine


@contextmanager
def stopped(url: str) -> Iterator[None]:
    """The redis server at ``url`` SIGSTOPped (it accepts, never answers) until exit."""
    pid = int(redis.Redis.from_url(url).info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
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


def test_objects_saved_during_backoff_are_demoted_not_dropped(tmp_path: Path) -> None:
    with run_redis(tmp_path) as url:
        remote = RemoteTier(url, REMOTE, timeout=0.5, min_backoff=1.0, max_backoff=1.0)
        m = TierManager([HostTier(HOST), remote])
        dropped: list[ObjectKey] = []
        m.set_drop_listener(dropped.extend)
        try:
            early = items(0, 4)
            assert all(m.put(early))  # host and remote copies
            assert all(m.put(items(10, 2)))  # two of ``early`` leave the host: remote-only
            with stopped(url):
                assert not remote.healthy()  # times out: the tier backs off
                assert remote.is_down
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
        finally:
            m.close()
