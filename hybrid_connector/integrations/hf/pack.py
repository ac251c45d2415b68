"""Move bytes between transformers' cache tensors and payload parts, through ``hybrid_connector/kernels/``.

What the parts are is ``hybrid_connector.payload.layout`` (one description from the geometry); this
module only moves them, each move one call of the ``kernels`` dispatch point (CUDA kernels
for CUDA tensors, bit-identical torch code elsewhere):

* KV: a ``DynamicLayer`` holds ``[1, heads, seq, head_dim]``, a KV part is token-major
  ``[n, heads, head_dim]``. Both are row tensors of ``head_dim`` values, so the transpose is
  a row gather (``kernels.pack_anchors``, same dtype) on the way out and a row scatter
  (``kernels.unpack_anchors``) on the way in: part row ``t * heads + h`` is cache row
  ``h * seq + start + t``.
* Conv state: the cache holds ``[1, channels, kernel]``, the part keeps the last
  ``kernel - 1`` columns: rows of ``kernel - 1`` values at a row stride of ``kernel``, which
  the same row kernels move (and cast, when a caller's dtype differs).
* Recurrent state: whole dense tensors, copied as pages (``kernels.copy_state_pages``), all
  layers of a checkpoint in one call.

Destinations are always written through views (never a silent copy), and sources are only
read. Shapes are checked by the kernels (ValueError naming the argument).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from hybrid_connector import kernels


@functools.lru_cache(maxsize=32)
def _kv_base(parts: int, heads: int, seq: int, n: int, device: torch.device) -> kernels.CheckedIndex:
    """Cache rows of ``parts`` consecutive KV parts of ``n`` tokens at position 0, in payload
    order (part, token, head), in ``parts`` stacked ``[1, heads, seq, dim]`` tensors:
    ``p * heads * seq + h * seq + t``. Checked and uploaded once per shape."""
    t = torch.arange(n, dtype=torch.int64).view(1, n, 1)
    h = torch.arange(heads, dtype=torch.int64).view(1, 1, heads) * seq
    p = torch.arange(parts, dtype=torch.int64).view(parts, 1, 1) * (heads * seq)
    return kernels.CheckedIndex.of((p + t + h).reshape(-1), device)


def _kv_index(heads: int, seq: int, start: int, n: int, device: torch.device,
              parts: int = 1) -> kernels.CheckedIndex:
    """The rows of ``_kv_base`` shifted to ``start`` on the device: a restore moves every
    part of every chunk, and per-call index checks cost ~100x the kernel. Raises
    ValueError when the tokens do not fit ``seq`` positions."""
    if start < 0 or start + n > seq:
        raise ValueError(f"tokens [{start}, {start + n}) do not fit a cache of {seq} positions")
    return _kv_base(parts, heads, seq, n, device).shifted(start)


@functools.lru_cache(maxsize=32)
def _identity(n: int, device: torch.device) -> kernels.CheckedIndex:
    return kernels.CheckedIndex.of(torch.arange(n, dtype=torch.int64), device)


def gather_kv(cache: torch.Tensor, start: int, out: torch.Tensor) -> None:
    """``out[t] = cache[0, :, start + t]`` for ``out`` ``[n, heads, head_dim]`` (contiguous,
    the cache's dtype) and ``cache`` ``[1, heads, seq, head_dim]``."""
    n, heads, dim = out.shape
    seq = int(cache.shape[2])
    rows = cache[0].reshape(heads * seq, dim)
    kernels.pack_anchors(rows, _kv_index(heads, seq, start, n, cache.device), out=out.view(n * heads, dim))


def scatter_kv(part: torch.Tensor, dst: torch.Tensor, start: int) -> None:
    """``dst[0, :, start + t] = part[t]`` for ``part`` ``[m, heads, head_dim]`` and ``dst``
    ``[1, heads, seq, head_dim]`` (contiguous; converted to its dtype)."""
    m, heads, dim = part.shape
    seq = int(dst.shape[2])
    kernels.unpack_anchors(part.contiguous().view(m * heads, dim), dst[0].view(heads * seq, dim),
                           _kv_index(heads, seq, start, m, dst.device))


def kv_buffers(shapes: Sequence[tuple[int, int, torch.dtype]], num_tokens: int,
               device: torch.device) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Cache tensors ``[1, heads, num_tokens, dim]``, one per ``(heads, dim, dtype)`` of
    ``shapes`` (K then V per attention layer, as a KV chunk's parts). When all are alike
    they are views of one ``[len(shapes), 1, heads, num_tokens, dim]`` allocation, returned
    second: :func:`scatter_kv_chunk` then moves a whole chunk in one kernel call."""
    if shapes and len(set(shapes)) == 1:
        heads, dim, dtype = shapes[0]
        joint = torch.empty((len(shapes), 1, heads, num_tokens, dim), dtype=dtype, device=device)
        return list(joint.unbind(0)), joint
    return [torch.empty((1, h, num_tokens, d), dtype=t, device=device) for h, d, t in shapes], None


def adopt_kv(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Make ``keys`` / ``values`` (``[1, heads, seq, dim]``, e.g. :func:`kv_buffers`' views)
    the contents of an empty attention layer of a transformers cache, without a copy: a
    plain ``DynamicLayer`` holds the tensors themselves. Its ``update`` would concatenate
    them onto empty tensors, a copy of every restored byte (and a second allocation of the
    whole KV while it runs). Any other layer class gets them through its own ``update``."""
    from transformers.cache_utils import DynamicLayer

    if type(layer) is DynamicLayer and not layer.is_initialized:
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    else:
        layer.update(keys, values)


def scatter_kv_chunk(parts: Sequence[torch.Tensor], bufs: Sequence[torch.Tensor],
                     joint: torch.Tensor | None, start: int, m: int) -> None:
    """``bufs[j][0, :, start + t] = parts[j][t]`` for ``t < m``: a KV chunk's parts
    (``[n, heads, dim]`` each) into the cache tensors of :func:`kv_buffers`. One kernel
    call for the whole chunk when ``joint`` holds the buffers, ``m`` is the chunk's length
    and the parts lie one after another in one payload (as ``PayloadLayout.unpack`` gives
    them); one per part otherwise (the hit's last, cut chunk)."""
    first = parts[0] if parts else None
    if (joint is not None and first is not None and m == first.shape[0]
            and len(parts) == joint.shape[0] and first.dtype == joint.dtype
            and all(p.is_contiguous() and p.shape == first.shape and p.dtype == first.dtype
                    and p.data_ptr() == first.data_ptr() + j * first.nbytes
                    for j, p in enumerate(parts))):
        n, heads, dim = first.shape
        idx = _kv_index(heads, int(joint.shape[3]), start, n, joint.device, parts=len(parts))
        rows = torch.as_strided(first, (len(parts) * n * heads, dim), (dim, 1),
                                first.storage_offset())
        kernels.unpack_anchors(rows, joint.view(-1, dim), idx)
        return
    for part, buf in zip(parts, bufs, strict=True):
        scatter_kv(part[:m], buf, start)


def gather_conv(conv: torch.Tensor, out: torch.Tensor) -> None:
    """The last ``kernel - 1`` columns of ``conv`` ``[1, *channels, kernel]`` into ``out``
    ``[*channels, kernel - 1]`` (contiguous, the conv's dtype)."""
    kernel = int(conv.shape[-1])
    rows = conv[0].reshape(-1, kernel)[:, 1:]
    kernels.pack_anchors(rows, _identity(int(rows.shape[0]), conv.device), out=out.view(-1, kernel - 1))


def scatter_conv(conv: torch.Tensor, dst: torch.Tensor) -> None:
    """Write ``conv`` (``[*channels, kernel - 1]`` or ``[*channels, kernel]``, any float
    dtype, on ``dst``'s device) into ``dst`` ``[1, *channels, kernel]`` (contiguous), cast
    to ``dst``'s dtype. A ``kernel - 1`` wide conv is right-aligned and the oldest column
    zeroed, as transformers pads a prefill shorter than the kernel."""
    kernel = int(dst.shape[-1])
    width = int(conv.shape[-1])
    rows = dst[0].view(-1, kernel)
    if width == kernel - 1:
        rows[:, 0].zero_()
        rows = rows[:, 1:]
    elif width != kernel:
        raise ValueError(f"conv state is {width} wide, the cache's kernel is {kernel}")
    data = conv.contiguous().view(-1, width)
    kernels.unpack_anchors(data, rows, _identity(int(data.shape[0]), dst.device))


def copy_states(src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for same-shape, same-dtype dense tensors on one device, as
    one ``kernels.copy_state_pages`` call (each tensor one page)."""
    if src:
        kernels.copy_state_pages([s.unsqueeze(0) for s in src], [d.unsqueeze(0) for d in dst],
                                 [0], [0])
