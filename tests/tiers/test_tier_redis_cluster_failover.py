"""A master of a real Redis Cluster killed (SIGKILL: connections refused) or hung (SIGSTOP:
connections accepted, never answered) mid-run: its keys are misses until its replica is
promoted, then hits again; the other shards' keys hit throughout; no call blocks past the
configured deadline; nothing corrupt is ever served.

Reader threads (the writer's instance, which indexes the objects, and a fresh one that asks
the cluster) loop over every key, timing each call and checking every tensor returned bit
for bit. The cluster is this test's own (``cluster-node-timeout`` 1000 ms), so a
promotion takes a few seconds; the time from the kill until the victim's keys hit again is
printed (``-s``) and bounded.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from cluster_servers import run_cluster
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.keys import ObjectKind
from tiers.remote import RemoteTier

K = ObjectKind
BIG = {k: 1 << 30 for k in K}
DEADLINE = 0.5
SLACK = 0.35  # thread scheduling on a loaded 2-core host, not the client


@pytest.mark.server
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_failed_master_is_misses_until_its_replica_is_promoted(tmp_path: Path, how: str) -> None:
    torch.set_num_threads(1)
    with run_cluster(tmp_path, node_timeout_ms=1000) as c:
        writer = RemoteTier(c.url, BIG, timeout=DEADLINE, chunk_size=1 << 20,
                            min_backoff=0.05, max_backoff=0.2)
        reader = RemoteTier(c.url, BIG, timeout=DEADLINE, min_backoff=0.05, max_backoff=0.2)
        its = [(make_key(i, K.KV, fp="fo"), make_payload(i, (256,))) for i in range(48)]
        its += [(make_key(100 + i, K.STATE, fp="fo"), make_payload(i, (400_000,))) for i in range(3)]
        assert writer.put(its) == [True] * len(its)
        truth = {k: v for k, v in its}
        for p in c.masters():  # every write reached the replicas before the crash
            assert c.cli_call(p, "wait", "1", "5000").strip() == "1"
        from redis.crc import key_slot  # CRC16 of the hash tag: no connection needed

        def master(k: object) -> int:
            return c.master_of_slot(key_slot(writer.client.name_for(k).encode()))  # type: ignore[arg-type]
        victim = master(its[0][0])
        on_victim = {k for k, _ in its if master(k) == victim}
        assert 0 < len(on_victim) < len(its)

        stop = threading.Event()
        slowest = [0.0]
        corrupt: list[object] = []
        hits_elsewhere_after_kill = [0, 0]  # (hits, calls) on the other shards after the kill
        killed_at = [0.0]

        def read_loop(tier: RemoteTier, into: bool) -> None:
            while not stop.is_set():
                for k, v in its:
                    t0 = time.monotonic()
                    if into:
                        out = torch.zeros_like(v)
                        got = out if tier.get_into([k], [out])[0] else None
                    else:
                        got = tier.get([k])[0]
                    slowest[0] = max(slowest[0], time.monotonic() - t0)
                    if got is not None and not same_bits(got, v):
                        corrupt.append(k)
                    if killed_at[0] and k not in on_victim:
                        hits_elsewhere_after_kill[0] += got is not None
                        hits_elsewhere_after_kill[1] += 1

        threads = [threading.Thread(target=read_loop, args=(t, into), daemon=True)
                   for t, into in ((writer, False), (reader, True), (reader, False))]
        for t in threads:
            t.start()
        time.sleep(0.5)
        (c.kill if how == "kill" else c.stop)(victim)
        killed_at[0] = time.monotonic()
        victim_keys = sorted(on_victim, key=str)
        # one batch over every shard, the victim's keys first: the others still answer
        asker = RemoteTier(c.url, BIG, timeout=DEADLINE)
        assert asker.healthy()
        t0 = time.monotonic()
        found = asker.contains(victim_keys + [k for k in truth if k not in on_victim])
        assert time.monotonic() - t0 < DEADLINE + SLACK
        assert found == [False] * len(victim_keys) + [True] * (len(its) - len(victim_keys))
        asker.close()
        # the victim's keys: misses (within the deadline) until promotion, then hits
        probe = RemoteTier(c.url, BIG, timeout=DEADLINE, min_backoff=0.05, max_backoff=0.2)
        missed, back_after = 0, None
        while time.monotonic() - killed_at[0] < 60:
            t0 = time.monotonic()
            got = probe.get(victim_keys)
            assert time.monotonic() - t0 < len(victim_keys) * 0.02 + DEADLINE + SLACK
            assert all(g is None or same_bits(g, truth[k]) for g, k in zip(got, victim_keys, strict=True))
            if all(g is not None for g in got):
                back_after = time.monotonic() - killed_at[0]
                break
            missed += sum(g is None for g in got)
            assert probe.put([(make_key(999, fp="fo-w"), make_payload(9, (8,)))]) in ([True], [False])
            time.sleep(0.05)
        time.sleep(0.5)  # the readers see the promoted shard too
        stop.set()
        for t in threads:
            t.join(10)
        print(f"\nfailover ({how}): victim :{victim} ({len(on_victim)} of {len(its)} keys); misses until "
              f"its replica served them: {missed}; back after {back_after:.2f} s; slowest call "
              f"{slowest[0]:.3f} s (deadline {DEADLINE} s); other shards' hits after the kill "
              f"{hits_elsewhere_after_kill[0]}/{hits_elsewhere_after_kill[1]}")
        assert back_after is not None and missed > 0
        assert not corrupt
        assert slowest[0] < DEADLINE + SLACK
        h, n = hits_elsewhere_after_kill
        assert n > 0 and h == n  # the other shards never stopped serving
        # every instance hits on everything again, through the promoted replica, soon
        # after the probe did (each client finds the new master on its own)
        for t in (writer, reader):
            t0 = time.monotonic()
            while not all(same_bits(g, v) for g, (_, v) in zip(t.get(list(truth)), its, strict=True)):
                assert time.monotonic() - t0 < 5.0
                time.sleep(0.05)
        assert victim not in c.masters()
        for t in (writer, reader, probe):
            t.close()
