"""The cache's values to and from wire messages. Decoding checks every field the core
would trust (keys parse as ``ObjectKey``, sizes are positive, tokens are whole int64s) and
raises ValueError otherwise; ``fingerprint`` restricts plans to one model's keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKey, ObjectKind, as_tokens
from hybrid_connector.index.discovery import Found
from hybrid_connector.index.plan import LoadPlan, PlannedObject, Rejection, SaveResult
from hybrid_connector.policies.base import SavePlan
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.tree.radix import ObjectRef

# Config keys that shape objects and hit lengths: the server's index for a client uses the
# client's values (they enter what the client packs and hashes), the server's for the rest.
CLIENT_KEYS = ("chunk_size", "hash_block_size", "alignment", "anchor_page_size",
               "anchor_density", "replay", "save_decode_cache")
MAX_TOKENS = 1 << 24


def tokens_bytes(tokens: Sequence[int] | np.ndarray) -> bytes:
    return as_tokens(tokens).astype("<i8", copy=False).tobytes()


def tokens_of(raw: bytes) -> np.ndarray:
    """int64 tokens from the wire; ValueError for a ragged or absurd buffer."""
    if len(raw) % 8 or len(raw) // 8 > MAX_TOKENS:
        raise ValueError(f"token buffer of {len(raw)} B is not a list of at most "
                         f"{MAX_TOKENS} int64 tokens")
    arr = np.frombuffer(raw, dtype="<i8").astype(np.int64)
    if arr.size and int(arr.min()) < 0:
        raise ValueError("negative token id")
    return arr


def client_cache_keys(config: HybridConfig) -> dict[str, Any]:
    return {k: getattr(config, k) for k in CLIENT_KEYS}


def _obj(o: PlannedObject) -> m.Obj:
    return m.Obj(o.ref.key.to_str(), o.ref.nbytes, o.tier)


def _planned(o: m.Obj, fingerprint: str | None) -> PlannedObject:
    key = ObjectKey.from_str(o.key)
    if fingerprint is not None and key.fingerprint != fingerprint:
        raise ValueError(f"object {o.key} belongs to another model")
    if o.nbytes <= 0:
        raise ValueError(f"object {o.key} has size {o.nbytes}")
    return PlannedObject(ObjectRef(key, o.nbytes), o.tier)


def plan_msg(plan: LoadPlan) -> m.Plan:
    return m.Plan(plan.num_tokens, plan.exact, [_obj(o) for o in plan.kv],
                  _obj(plan.state) if plan.state else None, [_obj(o) for o in plan.anchors],
                  plan.replay_from, plan.kv_tokens, plan.matched_tokens, plan.prompt_tokens,
                  plan.node_id, plan.is_async, plan.alignment, plan.pending_tokens)


def plan_of(p: m.Plan, fingerprint: str | None = None) -> LoadPlan:
    """The ``LoadPlan`` a message describes (ValueError for a key that does not parse or
    that belongs to a model other than ``fingerprint``)."""
    return LoadPlan(p.num_tokens, p.exact, tuple(_planned(o, fingerprint) for o in p.kv),
                    _planned(p.state, fingerprint) if p.state else None,
                    tuple(_planned(o, fingerprint) for o in p.anchors), p.replay_from,
                    p.kv_tokens, p.matched_tokens, p.prompt_tokens, p.node_id, p.is_async,
                    p.alignment, p.pending_tokens)


def save_reply(r: SaveResult) -> m.SaveReply:
    return m.SaveReply(r.stored, r.present, r.rejected, r.evicted_bytes,
                       [m.RejectionMsg(x.kind.value, x.start, x.end, x.reason)
                        for x in r.rejections], r.leaf)


def save_result(r: m.SaveReply) -> SaveResult:
    return SaveResult(r.stored, r.present, r.rejected, r.evicted_bytes,
                      tuple(Rejection(ObjectKind(x.kind), x.start, x.end, x.reason)
                            for x in r.rejections), tuple(r.leaf))  # type: ignore[arg-type]


def save_plan_reply(p: SavePlan) -> m.SavePlanReply:
    return m.SavePlanReply(list(p.state_positions), p.branch_point, p.kv_from)


def save_plan(p: m.SavePlanReply) -> SavePlan:
    return SavePlan(tuple(p.state_positions), p.branch_point, p.kv_from)


def found_reply(f: Found) -> m.FoundReply:
    return m.FoundReply(f.kv_tokens, f.states, f.anchors, f.seconds)


def found(f: m.FoundReply) -> Found:
    return Found(f.kv_tokens, f.states, f.anchors, f.seconds)
