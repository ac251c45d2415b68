"""Helpers of the fault and crash tests: self-checking plain payloads, a served-normally
check, and a conversation saved through ``ServerCache`` whose loads are verified."""

from __future__ import annotations

import time
from typing import Any

import blake3
import numpy as np
import torch
from raw_client import Raw, lm_key

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.remote.client.server_cache import ServerCache
from hybrid_connector.remote.wire.frames import Code
from hybrid_connector.runtime.session import RequestSession

GEO = get_preset("qwen3.5-0.8b")


def payload(i: int, n: int = 64 << 10) -> bytes:
    """``n`` bytes whose first 16 are the blake3 of the rest (and a function of ``i``)."""
    rest = np.random.default_rng(i).integers(0, 256, n - 16, dtype=np.uint8).tobytes()
    return blake3.blake3(rest).digest(length=16) + rest


def intact(data: bytes) -> bool:
    return blake3.blake3(data[16:]).digest(length=16) == data[:16]


def healthy(url: str) -> None:
    """Another client is served normally: a put, an exist, a bit-exact get."""
    with Raw(url) as r:
        assert r.health() == Code.OK
        r.put(lm_key(999_999), payload(7))
        assert r.exist(lm_key(999_999))
        assert r.get(lm_key(999_999)) == payload(7)


def fill(kind: ObjectKind, start: int, end: int, nbytes: int, tag: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((tag, kind.value, start, end)) & 0xFFFF_FFFF)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def save_conversation(cache: ServerCache, prompt: np.ndarray, tag: int = 0) -> None:
    """One request's saves (KV chunks, checkpoints, the final one); payloads ``fill``."""
    s = RequestSession(cache, prompt)
    s.load()
    s.release()

    def kv(a: int, b: int) -> torch.Tensor:
        return fill(ObjectKind.KV, a, b, cache.expected_nbytes(ObjectKind.KV, a, b), tag)

    def st(p: int) -> torch.Tensor:
        return fill(ObjectKind.STATE, p, p, cache.expected_nbytes(ObjectKind.STATE, p, p), tag)

    s.save_prefill(kv, {q: st(q) for q in s.checkpoints})
    q = cache.final_checkpoint(len(s.tokens))
    s.finish(kv, {q: st(q)} if q else {})


def loads_intact(cache: ServerCache, prompt: np.ndarray, tag: int = 0) -> tuple[int, bool]:
    """(hit, every loaded byte is the one saved) of a lookup and load of ``prompt``."""
    plan = cache.lookup(prompt)
    r = cache.load(plan)
    ok = not r.failed and all(torch.equal(t, fill(ObjectKind.KV, o.ref.key.start, o.ref.key.end,
                                                  t.numel(), tag))
                              for o, t in zip(plan.kv, r.kv, strict=True))
    if plan.state is not None:
        p = plan.state.ref.key.end
        ok &= r.state is not None and torch.equal(r.state, fill(ObjectKind.STATE, p, p,
                                                                r.state.numel(), tag))
    return plan.num_tokens, ok


def wait_for(cond: Any, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())
