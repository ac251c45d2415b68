"""Input validation shared by every kernel wrapper.

Both backends (CUDA and torch) run the same checks first, so a bad call fails the
same way everywhere with a ``ValueError`` naming the argument, and nothing is
written before the checks pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .checked_index import CheckedIndex, host_index, is_unique

IndexLike = Sequence[int] | torch.Tensor | CheckedIndex

#: dtypes that can hold model activations, KV and recurrent state.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def index_tensor(
    ids: IndexLike,
    name: str,
    *,
    upper: int,
    device: torch.device,
    unique: bool,
) -> torch.Tensor:
    """Validate an index list and return it as a 1-D int64 tensor on ``device``.

    Accepts a sequence of ints or an integer tensor (any device; a CUDA tensor is
    copied to the host for the checks, which synchronises: pass host indices on
    hot paths). Raises ``ValueError`` when an index is outside ``[0, upper)``, the
    tensor is not 1-D or not integral, or ``unique`` and an index repeats (a
    scatter with repeated targets has no defined result on a GPU). A
    :class:`CheckedIndex` was checked when built: only its stored bounds are compared,
    and its copy on ``device`` is returned (no host work, no synchronisation).
    """
    if isinstance(ids, CheckedIndex):
        if ids.numel() and ids.hi >= upper:
            raise ValueError(f"{name} holds {ids.hi}, outside the valid range [0, {upper})")
        if unique and not ids.unique:
            raise ValueError(f"{name} holds repeated indices; each target must appear once")
        return ids.on(device)
    host = host_index(ids, name)
    if host.numel():
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= upper:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds {bad}, outside the valid range [0, {upper})")
        if unique and not is_unique(host):
            raise ValueError(f"{name} holds repeated indices; each target must appear once")
    return to_device(host, device)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a small host tensor to ``device`` without blocking the host.

    A plain ``.to("cuda")`` from pageable memory waits for the current stream to
    drain; staging through pinned memory keeps kernel launches asynchronous (the
    pinned block is recycled only after the copy ran).
    """
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def require_float(t: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` unless ``t`` has one of ``FLOAT_DTYPES``."""
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def require_same_device(*named: tuple[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` if the tensors do not all live on one device."""
    first_name, first = named[0]
    for name, t in named[1:]:
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}")


def require_inner_contiguous(t: torch.Tensor, name: str, dims: int) -> None:
    """Raise ``ValueError`` unless the last ``dims`` dimensions of ``t`` are packed.

    The kernels move whole rows (or whole pages) as byte ranges, so the trailing
    dimensions must be laid out densely; the leading ones may have any stride.
    """
    expected = 1
    for size, stride in zip(reversed(t.shape[-dims:]), reversed(t.stride()[-dims:]), strict=True):
        if size != 1 and stride != expected:
            raise ValueError(
                f"{name} must be dense in its last {dims} dim(s); shape {tuple(t.shape)} "
                f"has strides {t.stride()}"
            )
        expected *= size
