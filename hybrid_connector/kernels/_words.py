"""Bit-exact reinterpretation that makes the torch fallbacks move fewer, wider elements.

torch's CPU ``index_copy_``/``index_put_`` cost per element, so a bf16 row moved as
int64 words is several times faster, with identical bytes. Used only where the data
is moved, never converted.
"""

from __future__ import annotations

import torch

_WORDS = (torch.int64, torch.int32, torch.int16)


def as_words(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed with the widest integer dtype dividing its dense last dim, every
    leading stride and its offset (in bytes); ``t`` itself if none applies."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return t
    es = t.element_size()
    last = t.shape[-1] * es
    for dt in _WORDS:
        w = dt.itemsize
        if w <= es:
            break
        if last % w or (t.storage_offset() * es) % w or any((s * es) % w for s in t.stride()[:-1]):
            continue
        try:
            return t.view(dt)
        except RuntimeError:
            continue
    return t


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[t.shape[0], -1]`` when its trailing dims merge into one (a view)."""
    if t.dim() <= 2:
        return t
    try:
        return t.view(t.shape[0], t.shape[1:].numel())
    except RuntimeError:
        return t
