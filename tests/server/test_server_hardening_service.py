"""Hostile clients against the server's service layer, by behaviour (the recipes a soak
benchmark replays): models created without bound, plain names never forgotten, LOAD sizes
forged to make the server forget others' objects, leases held forever or by the thousand.
Each attack runs against the real server (``served``) with real clients next to it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from fault_support import GEO, healthy, loads_intact, payload, save_conversation, wait_for
from raw_client import Raw, lm_key
from server_support import client_config, save_and_close, served, server_config

from hybrid_connector import assemble
from hybrid_connector.core.config import HybridConfig, load_config
from hybrid_connector.remote.client.server_cache import ServerCache
from hybrid_connector.remote.wire import convert as cv
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import Code, Ext, request
from hybrid_connector.server.sessions import Sessions
from hybrid_connector.tiers.lm_protocol import Command

LIMITS = {"frame_timeout_s": 1.0, "min_rate": 1 << 30, "idle_timeout_s": 2.0,
          "max_object_bytes": 32 << 20, "max_frame_bytes": 64 << 20}


def limited(tmp: Path, host_mb: float = 256, pools: dict[str, Any] | None = None,
            **server: Any) -> dict[str, Any]:
    cfg = server_config(tmp, host_mb=host_mb, server={**LIMITS, **server})
    return {**cfg, "pools": pools} if pools else cfg


def prompt_of(i: int, n: int = 600) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 1000, n)


def why(message: bytes) -> str:
    return msgspec.msgpack.decode(message, type=m.Error).message


def hello(r: Raw, cfg: HybridConfig, session: str, model_id: str = "") -> tuple[int, bytes]:
    code, msg, _ = r.call(Ext.HELLO, m.Hello(GEO.to_dict(), {}, model_id,
                                             cv.client_cache_keys(cfg), session))
    return code, msg


def plan_of(r: Raw, prompt: np.ndarray) -> m.Plan:
    code, msg, _ = r.call(Ext.LOOKUP, m.Lookup(cv.tokens_bytes(prompt)))
    assert code == Code.OK
    return msgspec.msgpack.decode(msg, type=m.Plan)


def acquire(r: Raw, plan: m.Plan) -> tuple[int, int | None, bytes]:
    """(code, lease id, message) of one ACQUIRE of ``plan``."""
    code, msg, _ = r.call(Ext.ACQUIRE, m.PlanMsg(plan))
    lease = msgspec.msgpack.decode(msg, type=m.LeaseReply).lease if code == Code.OK else None
    return code, lease, msg


def pins(server: Any) -> int:
    with server.store.lock:
        return sum(e.pins for e in server.store.ledger.entries.values())


def leases(server: Any) -> int:
    return int(server.service.stats()["server"]["leases"])


# ---------------------------------------------------------------- 4: models per client
def test_models_are_capped_and_unused_empty_ones_are_freed(tmp_path: Path) -> None:
    """Recipe: one connection sends 50 HELLOs, each with a new ``model_id``; then four
    connections each HELLO a model of their own and stay open (cap 4, one place taken by
    a model holding objects). Before: every HELLO made an index that was never freed.
    After: an unused empty index is freed when a new model needs its place."""
    # idle_timeout_s 60: a held connection cut while idle on a loaded host frees its model
    with served(limited(tmp_path, max_models=4, idle_timeout_s=60.0)) as server:
        models = server.service.models
        cfg = client_config(server.url, chunk_size=256)
        with Raw(server.url) as r:
            for i in range(50):
                assert hello(r, cfg, "flood", f"flood-{i}")[0] == Code.OK
            assert len(models.caches()) <= 4  # the unused empty ones were freed at the cap
        assert models.freed >= 46
        keeper = save_and_close(cfg, prompt_of(1), model_id="keeper")  # a model holding objects
        kept = models.by_fingerprint[keeper]
        assert wait_for(lambda: not server.service.stats()["server"]["connections"])
        held = [Raw(server.url) for _ in range(3)]
        try:
            for i, r in enumerate(held):
                assert hello(r, cfg, f"user-{i}", f"user-{i}")[0] == Code.OK
            with Raw(server.url) as extra:
                code, msg = hello(extra, cfg, "late", "late")
                assert code == Code.UNAVAILABLE and "max_models" in why(msg), (code, msg)
                assert extra.health() == Code.OK  # refused, not cut off
                held[0].close()  # its model is unused and empty now: freed, room for one
                assert wait_for(lambda: hello(extra, cfg, "late", "late")[0] == Code.OK)
        finally:
            for r in held:
                r.close()
        reader = ServerCache(cfg, GEO, model_id="keeper")
        try:
            assert loads_intact(reader, prompt_of(1)) == (592, True)
        finally:
            reader.close()
        assert models.by_fingerprint[reader.fingerprint] is kept  # never freed


# ---------------------------------------------------------------- 5: plain names
def test_plain_names_are_forgotten_with_their_objects(tmp_path: Path) -> None:
    """Recipe: 1,000 plain PUTs of 64 KiB into a 4 MiB host tier (about 38 fit). Before:
    every name was remembered (and LIST walked them all)."""
    with served(limited(tmp_path, host_mb=4)) as server:
        with Raw(server.url) as r:
            for i in range(1000):
                r.put(lm_key(i), payload(i % 7))
            assert r.exist(lm_key(999))  # the connection's last PUT has been stored
            r.send(request(int(Command.LIST), 0, ""))
            code, body = r.reply()
            assert code == Code.OK
        listed = body.decode().split("\n")
        plain = server.service.stats()["plain"]
        objects = sum(c[0] for by_tier in plain["held"].values()
                      for by_kind in by_tier.values() for c in by_kind.values())
        assert plain["puts"] == 1000 and 10 < objects < 100, plain
        assert plain["names"] == objects == len(listed), (plain["names"], objects, len(listed))
        assert lm_key(999) in listed and lm_key(0) not in listed
        healthy(server.url)


# ---------------------------------------------------------------- 6: forged LOAD sizes
def test_forged_load_sizes_are_the_clients_error_not_the_objects(tmp_path: Path) -> None:
    """Recipe: HELLO, LOOKUP, ACQUIRE the plan, LOAD it with every size one byte more.
    Before: the server read with the client's sizes, found every object "short" and
    forgot it: another client's hit dropped to 0."""
    with served(limited(tmp_path)) as server:
        cfg = client_config(server.url, chunk_size=256)
        prompt = prompt_of(2, 1000)
        honest = ServerCache(cfg, GEO)
        try:
            save_conversation(honest, prompt)
            honest.flush()
            before = honest.lookup(prompt).num_tokens
            assert before == 992
            with Raw(server.url) as r:
                assert hello(r, cfg, "forger")[0] == Code.OK
                plan = plan_of(r, prompt)
                code, lease, _ = acquire(r, plan)
                assert code == Code.OK and lease is not None
                forged = msgspec.structs.replace(plan, kv=[
                    msgspec.structs.replace(o, nbytes=o.nbytes + 1) for o in plan.kv],
                    state=msgspec.structs.replace(plan.state, nbytes=plan.state.nbytes + 1)
                    if plan.state else None)
                code, msg, data = r.call(Ext.LOAD, m.Load(forged, lease))
                assert code == Code.FAIL and data == b"" and "the plan says" in why(msg)
                code, msg, data = r.call(Ext.LOAD, m.Load(plan, lease))  # its own plan: fine
                reply = msgspec.msgpack.decode(msg, type=m.LoadReply)
                assert code == Code.OK and reply.num_tokens == before and not reply.failed
            assert loads_intact(honest, prompt) == (before, True)
            (model,) = server.service.stats()["models"].values()
            assert model["load_failures"] == 0
        finally:
            honest.close()


# ---------------------------------------------------------------- 7: leases
def test_leases_per_session_are_capped(tmp_path: Path) -> None:
    """Recipe: one session ACQUIREs one plan 2,000 times. Before: all 2,000 were held."""
    # lease_timeout_s 600: none expires during 2,000 ACQUIREs on a loaded host
    with served(limited(tmp_path, max_leases_per_session=8, lease_timeout_s=600.0)) as server:
        cfg = client_config(server.url, chunk_size=256)
        save_and_close(cfg, prompt_of(3))
        with Raw(server.url) as r:
            assert hello(r, cfg, "hoarder")[0] == Code.OK
            plan = plan_of(r, prompt_of(3))
            codes = [acquire(r, plan) for _ in range(2000)]
            assert [c for c, _, _ in codes[:8]] == [Code.OK] * 8
            assert {c for c, _, _ in codes[8:]} == {Code.FAIL}
            assert "max_leases_per_session" in why(codes[8][2])
            assert leases(server) == 8
            first = codes[0][1] or 0
            assert r.call(Ext.RELEASE, m.Release(first))[0] == Code.OK  # room for one more
            assert acquire(r, plan)[0] == Code.OK
        assert wait_for(lambda: leases(server) == 0 and pins(server) == 0)


def test_leases_expire_while_the_session_keeps_its_connection_alive(tmp_path: Path) -> None:
    """Recipe: one session ACQUIREs a plan five times, then sends STATS every 0.3 s and
    never RELEASEs. Before: the leases lived as long as the connection. The wait is
    generous: expiry only has to happen, not on time; the lifetime (5 s) outlasts the five
    ACQUIREs on a loaded host, and ``idle_timeout_s`` (60 s) never cuts the connection."""
    with served(limited(tmp_path, lease_timeout_s=5.0, idle_timeout_s=60.0)) as server:
        cfg = client_config(server.url, chunk_size=256)
        save_and_close(cfg, prompt_of(4))
        with Raw(server.url) as r:
            assert hello(r, cfg, "squatter")[0] == Code.OK
            plan = plan_of(r, prompt_of(4))
            ids = [acquire(r, plan)[1] or 0 for _ in range(5)]
            assert 0 not in ids and leases(server) == 5 and pins(server) > 0

            def released() -> bool:
                assert r.call(Ext.STATS, m.Empty())[0] == Code.OK  # keeps it alive
                time.sleep(0.25)
                return leases(server) == 0 and pins(server) == 0

            assert wait_for(released, within=30.0)
            code, msg, data = r.call(Ext.LOAD, m.Load(plan, ids[0]))  # expired: unknown
            assert code == Code.FAIL and data == b"" and "live lease" in why(msg)
            assert r.call(Ext.RELEASE, m.Release(ids[1]))[0] == Code.FAIL
            assert r.health() == Code.OK
        reader = ServerCache(cfg, GEO)
        try:
            assert loads_intact(reader, prompt_of(4)) == (592, True)
        finally:
            reader.close()


def test_one_session_cannot_pin_a_whole_budget(tmp_path: Path) -> None:
    """Recipe: four conversations fill a state pool of four checkpoints; one session
    ACQUIREs each one's plan (and holds them); another client then saves a fifth.
    Before: the fifth's state was refused ``no_room``: every state was pinned."""
    pools = {"host": {"kv": "64MiB", "state": "80MiB", "anchor": "8MiB"}}
    cfgd = limited(tmp_path, pools=pools, lease_timeout_s=600.0)  # held throughout
    with served(cfgd) as server:
        cfg = client_config(server.url, chunk_size=256)
        writer = ServerCache(cfg, GEO)
        for i in range(4):
            save_conversation(writer, prompt_of(10 + i), tag=i)
        writer.flush()
        (model,) = server.service.stats()["models"].values()
        assert model["held"]["host"]["state"][0] == 4
        with Raw(server.url) as r:
            assert hello(r, cfg, "pinner")[0] == Code.OK
            got = [acquire(r, plan_of(r, prompt_of(10 + i))) for i in range(4)]
            assert [c for c, _, _ in got[:2]] == [Code.OK, Code.OK]
            assert got[2][0] == Code.FAIL and "max_pinned_fraction" in why(got[2][2])
            pinned = server.service.stats()["server"]["pinned_bytes"]
            state_pool = 80 << 20
            assert 0 < pinned <= state_pool // 2 + (64 << 20) // 2
            save_conversation(writer, prompt_of(20), tag=5)  # another client saves meanwhile
            writer.flush()
            (model,) = server.service.stats()["models"].values()
            assert model["rejected"]["state"] == 0, model["rejected"]
            assert loads_intact(writer, prompt_of(20), tag=5) == (592, True)
            assert loads_intact(writer, prompt_of(10), tag=0) == (592, True)  # pinned: kept
        writer.close()
        assert wait_for(lambda: leases(server) == 0 and pins(server) == 0)


def test_a_lease_a_load_reads_through_outlives_its_lifetime_until_the_read_ends(
        tmp_path: Path) -> None:
    """``Sessions`` on an injected clock, over a real embedded cache: an expired lease that
    a LOAD has checked out is kept until it is checked in, then expires."""
    cfg = load_config(overrides={"chunk_size": 256, "max_local_cpu_size": "256MiB",
                                 "server": {"lease_timeout_s": 5.0}}, environ={})
    cache = assemble.cache(cfg, GEO)
    try:
        save_conversation(cache, prompt_of(5))  # type: ignore[arg-type]
        now = [100.0]
        sessions = Sessions(cfg.server, clock=lambda: now[0])
        sessions.join("s")
        plan = cache.lookup(prompt_of(5))
        lid = sessions.acquire("s", cache, plan)
        assert lid is not None and sessions.counts()["leases"] == 1
        now[0] += 4.9
        assert sessions.expired() == []
        held = sessions.checkout("s", lid)  # a LOAD starts reading
        assert held is not None
        now[0] += 0.2
        assert sessions.expired() == []  # past its lifetime, but being read
        sessions.checkin(held)
        now[0] += 1.0  # BUSY_RETRY_S
        (gone,) = sessions.expired()
        assert gone is held and sessions.counts() == {
            "sessions": 1, "connections": 1, "leases": 0, "pinned_bytes": 0}
        cache.release(gone.lease)
        assert sessions.checkout("s", lid) is None
    finally:
        cache.close()
