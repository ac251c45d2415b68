"""Fuzzing of the frame parser and of the hybrid command path (hypothesis, 11,000 cases
in all): any bytes give a parsed frame or ``FrameError``; any message body gives a
reply with a protocol code and never ``INTERNAL`` (a crash of the handler) or an exception.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybrid_connector.core.config import load_config
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.remote.wire import convert as cv
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import (
    EXT,
    HEADER_BYTES,
    PLAIN,
    Code,
    Ext,
    FrameError,
    parse_header,
    request,
    split_body,
    split_payloads,
)
from hybrid_connector.server.service import Conn, Service
from hybrid_connector.tiers.manager import build_store

FAST = settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
COMMANDS = sorted(PLAIN | EXT) + [0, -1, 6, 100, 114, 2**31 - 1]


@FAST
@given(st.binary(min_size=HEADER_BYTES, max_size=HEADER_BYTES))
def test_any_header_bytes_parse_or_raise_frame_error(raw: bytes) -> None:
    try:
        h = parse_header(raw, 1 << 20)
    except FrameError:
        return
    assert h.command in PLAIN | EXT and 0 <= h.length <= 1 << 20


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(COMMANDS), st.integers(-2**31, 2**31 - 1),
       st.text(max_size=60), st.lists(st.integers(-2**31, 2**31 - 1), min_size=6, max_size=6))
def test_structured_headers(command: int, length: int, key: str, meta: list[int]) -> None:
    try:
        raw = request(command, length, key, tuple(meta))  # type: ignore[arg-type]
    except (ValueError, Exception):  # a key over 150 bytes, an int out of struct range
        return
    try:
        h = parse_header(raw, 1 << 20)
    except FrameError:
        return
    assert (h.command, h.length, h.key, list(h.meta)) == (command, length, key.rstrip(" \x00"), meta)


@FAST
@given(st.binary(max_size=300), st.lists(st.integers(-5, 300), max_size=6))
def test_any_body_splits_or_raises_frame_error(raw: bytes, sizes: list[int]) -> None:
    try:
        message, payloads = split_body(raw)
        parts = split_payloads(payloads, sizes)
    except FrameError:
        return
    assert sum(len(p) for p in parts) == len(payloads) and len(message) <= len(raw)


@pytest.fixture(scope="module")
def service() -> Iterator[tuple[Service, Conn]]:
    cfg = load_config(overrides={"max_local_cpu_size": 0.05, "chunk_size": 64}, environ={})
    svc = Service(cfg, build_store(cfg, device="cpu"))
    conn = Conn(authed=True)
    geo = get_preset("qwen3.5-0.8b")
    hello = m.Hello(geo.to_dict(), {}, "fuzz", cv.client_cache_keys(cfg), "s" * 32)
    r = svc.ext(conn, Ext.HELLO, memoryview(msgspec.msgpack.encode(hello)), memoryview(b""))
    assert r.code == Code.OK, r.message
    yield svc, conn
    svc.close()


values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=64),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
FIELDS = {c: list(t.__struct_fields__) for c, t in
          __import__("hybrid_connector.server.service", fromlist=["x"]).REQUEST_TYPES.items()}


@st.composite
def messages(draw: st.DrawFn) -> tuple[Ext, bytes, bytes]:
    """A hybrid command with a body that is random bytes, or a map whose keys are the
    message's own fields (plus noise) with random values: the decoder and every handler
    behind it see hostile but well-formed msgpack."""
    command = draw(st.sampled_from([c for c in Ext if c not in (Ext.AUTH, Ext.HELLO)]))
    if draw(st.booleans()):
        body = draw(st.binary(max_size=200))
    else:
        keys = draw(st.lists(st.sampled_from([*FIELDS[command], "x"]), max_size=7, unique=True))
        body = msgspec.msgpack.encode({k: draw(values) for k in keys})
    return command, body, draw(st.binary(max_size=64))


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(messages())
def test_hostile_messages_never_crash_the_handler(service: tuple[Service, Conn],
                                                  msg: tuple[Ext, bytes, bytes]) -> None:
    svc, conn = service
    command, body, payloads = msg
    r = svc.ext(conn, command, memoryview(body), memoryview(payloads))
    assert r.code in {int(c) for c in Code} and r.code != Code.INTERNAL, msgspec.msgpack.decode(r.message)


ints = st.integers(-2**40, 2**40) | st.sampled_from([0, 1, 16, 64, 63, -1])
tokens = st.binary(max_size=80) | st.lists(st.integers(0, 2**20), max_size=300).map(cv.tokens_bytes)
obj = st.builds(m.Obj, st.text(max_size=40) | st.just("x@kv@0@64@" + "ab" * 16), ints, st.text(max_size=8))
plans = st.builds(m.Plan, ints, st.booleans(), st.lists(obj, max_size=3), st.none() | obj,
                  st.lists(obj, max_size=2), ints, ints, ints, ints, ints)
typed = st.one_of(
    st.tuples(st.just(Ext.LOOKUP), st.builds(m.Lookup, tokens, st.none() | ints,
                                             st.none() | st.booleans(), st.none() | ints)),
    st.tuples(st.just(Ext.DISCOVER), st.builds(m.Discover, tokens, st.none() | ints)),
    st.tuples(st.just(Ext.PLAN_SAVES), st.builds(m.PlanSaves, tokens, st.none() | ints)),
    st.tuples(st.just(Ext.FINAL_CHECKPOINT), st.builds(m.FinalCheckpoint, ints, st.none() | ints)),
    st.tuples(st.sampled_from([Ext.ACQUIRE, Ext.RECORD_LOOKUP]), st.builds(m.PlanMsg, plans)),
    st.tuples(st.just(Ext.LOAD), st.builds(m.Load, plans, ints)),
    st.tuples(st.just(Ext.RELEASE), st.builds(m.Release, ints)),
    st.tuples(st.just(Ext.SAVE), st.builds(
        m.Save, tokens, st.lists(st.builds(m.Item, st.sampled_from(["kv", "state", "anchor", "?"]),
                                           ints, ints, st.integers(-2, 40)), max_size=3),
        st.none() | st.tuples(ints, ints), st.booleans(), st.none() | ints)),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(typed, st.binary(max_size=120))
def test_well_typed_hostile_values_never_crash_the_handler(
        service: tuple[Service, Conn], msg: tuple[Ext, m.Msg], payloads: bytes) -> None:
    svc, conn = service
    command, body = msg
    r = svc.ext(conn, command, memoryview(msgspec.msgpack.encode(body)), memoryview(payloads))
    assert r.code in {int(c) for c in Code} and r.code != Code.INTERNAL, msgspec.msgpack.decode(r.message)
