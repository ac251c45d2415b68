"""Objects of the capacity benchmark: geometry bytes scaled down, payloads, verification.

``ScaledGeometry`` is a preset's geometry whose object bytes (KV per token, state
checkpoint, anchors) are divided by ``byte_scale`` while its FLOPs stay the model's: every
budget is divided by the same factor, so what fits where, the ratio working set / device
budget and the policies' FLOPs-per-byte order are those of the full-size model; only the
bytes actually moved are smaller (so a 2-core machine runs the sweep in minutes).

Payloads are a deterministic function of the tokens an object covers (``Payloads``). Every loaded
object is checked twice: against the payload its tokens give (the index planned the right
key) and, by ``Verifier``, against the digest of the bytes saved under its key (the tiers
returned what was stored, through every demotion and promotion).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
import xxhash

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.tiers.executor import Executor


class CorruptLoad(RuntimeError):
    """A loaded object differs from what was saved for it."""


@dataclass(frozen=True)
class ScaledGeometry(ModelGeometry):
    """``ModelGeometry`` with object bytes divided by ``byte_scale`` (FLOPs unchanged)."""

    byte_scale: int = 1

    @classmethod
    def of(cls, geo: ModelGeometry, byte_scale: int) -> ScaledGeometry:
        kw = {f.name: getattr(geo, f.name) for f in fields(geo) if f.init and f.name != "byte_scale"}
        out = cls(**kw, byte_scale=byte_scale)
        full = ModelGeometry.kv_bytes_per_token(out)
        if full % byte_scale or ModelGeometry.state_bytes(out) < byte_scale:
            raise ValueError(f"byte_scale {byte_scale} does not divide {geo.name}'s "
                             f"{full} KV bytes per token")
        return out

    def kv_bytes_per_token(self) -> int:
        return super().kv_bytes_per_token() // self.byte_scale

    def state_bytes(self) -> int:
        return super().state_bytes() // self.byte_scale

    def state_bytes_per_layer(self) -> dict[int, int]:
        return {k: v // self.byte_scale for k, v in super().state_bytes_per_layer().items()}

    def anchor_bytes_per_token(self) -> int:
        return max(1, super().anchor_bytes_per_token() // self.byte_scale)

    def fingerprint_fields(self) -> dict[str, object]:
        return {**super().fingerprint_fields(), "byte_scale": self.byte_scale}


_P = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible mod 2**64
_P_INV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 2**64))
_MIX = np.arange(1, 9, dtype=np.uint64) * np.uint64(0xBF58476D1CE4E5B9)


class Payloads:
    """Deterministic bytes standing in for what a model computes over ``tokens``: token i's
    KV is 64 bytes derived from a polynomial hash of ``tokens[:i+1]`` (mod 2**64,
    vectorised), tiled to the KV bytes of a token; the state at p the same of
    ``tokens[:p]`` tiled to the state's bytes. So a KV chunk is checkable over any prefix
    of it (the last chunk of a hit may reach past the prompt) and distinct prefixes give
    distinct bytes (up to hash collisions)."""

    def __init__(self, tokens: np.ndarray) -> None:
        t = np.asarray(tokens, dtype=np.uint64) + np.uint64(1)
        n = t.size
        with np.errstate(over="ignore"):
            pw = np.cumprod(np.full(n, _P, dtype=np.uint64))  # P^(j+1)
            inv = np.cumprod(np.full(n, _P_INV, dtype=np.uint64))
            h = np.cumsum(t * inv) * pw  # sum_j t_j P^(i-j), wrapping
            words = h[:, None] * _MIX[None, :]
            words ^= words >> np.uint64(29)
        self.rows = words.view(np.uint8).reshape(n, 64)

    def kv(self, start: int, end: int, per_token: int) -> torch.Tensor:
        reps = -(-per_token // 64)
        return torch.from_numpy(np.tile(self.rows[start:end], (1, reps))[:, :per_token].reshape(-1).copy())

    def state(self, p: int, nbytes: int) -> torch.Tensor:
        return torch.from_numpy(np.tile(self.rows[p - 1], -(-nbytes // 64))[:nbytes].copy())


def _digest(t: torch.Tensor) -> bytes:
    flat = t.detach().reshape(-1).contiguous().view(torch.uint8)
    return xxhash.xxh3_128_digest(flat.cpu().numpy().data)


class Verifier:
    """Wraps an ``Executor``'s ``submit`` and ``read`` (public calls every save and load
    goes through): the digest of every payload put under a key is kept, every payload read
    is checked against it (``CorruptLoad`` on a mismatch or an unknown key). ``verified``
    counts the checked reads."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.digests: dict[ObjectKey, bytes] = {}
        self.verified = 0
        self._submit, self._read = executor.submit, executor.read
        executor.submit = self.submit  # type: ignore[method-assign]
        executor.read = self.read  # type: ignore[method-assign]

    def submit(self, ops: Sequence[Any], payloads: Mapping[ObjectKey, torch.Tensor],
               done: Any = None, metas: Any = None) -> Future[list[bool]]:
        for key, t in payloads.items():
            self.digests[key] = _digest(t)
        return self._submit(ops, payloads, done=done, metas=metas)

    def read(self, keys: Sequence[ObjectKey], hints: Sequence[str | None] | None = None
             ) -> list[torch.Tensor | None]:
        out = self._read(keys, hints)
        for key, t in zip(keys, out, strict=True):
            if t is None:
                continue
            if key not in self.digests:
                raise CorruptLoad(f"{key.kind.value} [{key.start}, {key.end}) was read but never "
                                  "saved in this run")
            if self.digests[key] != _digest(t):
                raise CorruptLoad(f"{key.kind.value} [{key.start}, {key.end}) read back "
                                  "different bytes than were saved under its key")
            self.verified += 1
        return out
