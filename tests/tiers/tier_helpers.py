"""Helpers shared by the tier tests (keys, payloads, bit-identity)."""

from __future__ import annotations

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool,
          torch.float64, torch.int8]


def make_key(i: int, kind: ObjectKind = ObjectKind.KV, fp: str = "fp0") -> ObjectKey:
    """A distinct key per ``(i, kind, fp)``."""
    if kind is ObjectKind.STATE:
        return ObjectKey(fp, i.to_bytes(16, "little"), kind, i + 1, i + 1)
    return ObjectKey(fp, i.to_bytes(16, "little"), kind, i * 16, i * 16 + 16)


def make_payload(seed: int, shape: tuple[int, ...] = (4, 8), dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=dtype)


def same_bits(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    """Bit-identical: same dtype, same shape, same bytes (NaNs included)."""
    if a is None or a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
