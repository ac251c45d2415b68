"""Typed bodies of the hybrid commands (msgspec structs, msgpack on the wire).

Every request body decodes into exactly one of these types; anything else (wrong type,
missing field, extra nesting) is a ``msgspec.ValidationError``/``DecodeError``, which the
server answers with ``BAD_REQUEST`` and never raises past the connection. Token lists travel
as little-endian int64 bytes (``tokens``), payloads as raw bytes after the message
(``Item.nbytes`` / ``LoadReply`` sizes say how the blob splits).
"""

from __future__ import annotations

from typing import Any

import msgspec


class Msg(msgspec.Struct, forbid_unknown_fields=True):
    """Base of every message."""


class Auth(Msg):
    token: str


class Hello(Msg):
    """Bind this connection to one model: the geometry (``ModelGeometry.to_dict``), the
    engine layout and model id that enter the fingerprint, the cache keys of the client's
    config that must agree with the server's index (``wire.convert.CLIENT_KEYS``), and the
    client session (leases are owned by a session, released when its last connection
    closes)."""

    geometry: dict[str, Any]
    layout: dict[str, Any]
    model_id: str
    cache: dict[str, Any]
    session: str


class HelloReply(Msg):
    fingerprint: str
    version: str


class Obj(Msg):
    key: str
    nbytes: int
    tier: str


class Plan(Msg):
    num_tokens: int
    exact: bool
    kv: list[Obj] = []
    state: Obj | None = None
    anchors: list[Obj] = []
    replay_from: int = 0
    kv_tokens: int = 0
    matched_tokens: int = 0
    prompt_tokens: int = 0
    node_id: int = 0
    is_async: bool = False
    alignment: int = 1
    pending_tokens: int = 0


class Lookup(Msg):
    tokens: bytes
    alignment: int | None = None
    replay: bool | None = None
    at: int | None = None  # lookup_at(p)


class Discover(Msg):
    tokens: bytes
    alignment: int | None = None


class FoundReply(Msg):
    kv_tokens: int
    states: int
    anchors: int
    seconds: float


class PlanSaves(Msg):
    tokens: bytes
    alignment: int | None = None


class SavePlanReply(Msg):
    state_positions: list[int]
    branch_point: int | None
    kv_from: int


class FinalCheckpoint(Msg):
    num_tokens: int
    alignment: int | None = None


class IntReply(Msg):
    value: int


class PlanMsg(Msg):
    """A plan the server made, sent back (``record_lookup``, ``acquire``)."""

    plan: Plan


class LeaseReply(Msg):
    lease: int | None


class Release(Msg):
    lease: int


class Load(Msg):
    """Read an acquired plan: ``lease`` must be this session's and cover the plan."""

    plan: Plan
    lease: int


class LoadReply(Msg):
    """Then the payloads, in order: ``kv_sizes``, ``state_size``, ``anchor_sizes``."""

    num_tokens: int
    exact: bool
    kv_sizes: list[int]
    state_size: int | None
    anchor_sizes: list[int]
    failed: list[Obj]
    kv_tokens: int


class Item(Msg):
    kind: str
    start: int
    end: int
    nbytes: int


class Save(Msg):
    """Then the payloads of ``items`` in order. ``finish``: end the request afterwards
    (``HybridCache.finish`` with ``prompt_len``)."""

    tokens: bytes
    items: list[Item]
    start_leaf: tuple[int, int] | None = None
    finish: bool = False
    prompt_len: int | None = None


class RejectionMsg(Msg):
    kind: str
    start: int
    end: int
    reason: str


class SaveReply(Msg):
    stored: int
    present: int
    rejected: int
    evicted_bytes: int
    rejections: list[RejectionMsg]
    leaf: tuple[int, int]


class Empty(Msg):
    pass


class Error(Msg):
    message: str


class StatsReply(Msg):
    """The server's view: per model (fingerprint) its counters and bytes by kind and tier,
    the plain LMCache namespace, and the tiers' budgets and use."""

    models: dict[str, dict[str, Any]]
    plain: dict[str, Any]
    tiers: dict[str, dict[str, Any]]
    server: dict[str, Any]
