"""Pack a list of tensors into ONE contiguous 1-D tensor and back.

The cache stores opaque contiguous tensors; the transformers adapter decides what goes in
them. A payload is the concatenation of its parts, flattened in order. When every part has
the same dtype the payload keeps that dtype (readable in a debugger, no copies through
bytes); mixed dtypes (bf16 KV next to fp32 recurrent state) are packed as raw ``uint8``
bytes. Unpacking needs the same :class:`PartSpec` list and checks sizes, so a payload of
another layout is rejected with a clear error instead of being misread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PartSpec:
    """Shape (no batch dim) and dtype of one packed part."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def payload_dtype(specs: Sequence[PartSpec]) -> torch.dtype:
    """The dtype a payload of ``specs`` is stored in (shared dtype, else ``uint8``)."""
    dtypes = {s.dtype for s in specs}
    return dtypes.pop() if len(dtypes) == 1 else torch.uint8


def payload_nbytes(specs: Sequence[PartSpec]) -> int:
    return sum(s.nbytes for s in specs)


def pack(parts: Sequence[torch.Tensor], specs: Sequence[PartSpec]) -> torch.Tensor:
    """One new contiguous 1-D tensor holding ``parts`` (which must match ``specs`` in
    shape and dtype; ValueError naming the part otherwise). Inputs are not modified."""
    if len(parts) != len(specs):
        raise ValueError(f"pack: {len(parts)} tensors for {len(specs)} specs")
    if not specs:
        raise ValueError("pack: nothing to pack")
    out_dtype = payload_dtype(specs)
    flat: list[torch.Tensor] = []
    for t, s in zip(parts, specs, strict=True):
        if tuple(t.shape) != s.shape or t.dtype != s.dtype:
            raise ValueError(
                f"pack: part {s.name!r} is {tuple(t.shape)} {t.dtype}, expected {s.shape} {s.dtype}"
            )
        f = t.detach().contiguous().reshape(-1)
        flat.append(f.view(torch.uint8) if out_dtype == torch.uint8 else f)
    return torch.cat(flat)


def unpack(payload: torch.Tensor, specs: Sequence[PartSpec]) -> list[torch.Tensor]:
    """Views into ``payload`` (made contiguous first), one per spec, shaped and typed as
    ``specs`` say. Raises ValueError when the payload's dtype or size does not match."""
    want = payload_dtype(specs)
    flat = payload.detach().contiguous().reshape(-1)
    if flat.dtype != want:
        raise ValueError(f"unpack: payload dtype {flat.dtype}, layout expects {want}")
    total = sum(s.nbytes if want == torch.uint8 else s.numel for s in specs)
    if flat.numel() != total:
        raise ValueError(
            f"unpack: payload has {flat.numel()} elements, layout of {len(specs)} parts "
            f"expects {total} (a payload of another model or layout?)"
        )
    out: list[torch.Tensor] = []
    off = 0
    for s in specs:
        n = s.nbytes if want == torch.uint8 else s.numel
        piece = flat[off : off + n]
        off += n
        if want == torch.uint8:
            piece = piece.view(s.dtype)
        out.append(piece.view(s.shape))
    return out
