"""An index list validated once and kept on its device, for moves that repeat.

Every kernel call validates its index argument on the host (bounds, uniqueness for
scatters) and copies it to the device. That is cheap for one call and dominant for many
small ones: a restore issues one scatter per layer part per chunk, and on an H200 the
checks, the host sort behind the uniqueness test and the pinned staging took ~280 us of
host time per call against ~3 us of kernel. A :class:`CheckedIndex` pays them once; a call
given one only compares its stored bounds with the tensor's size.

Contract: the values never change after construction (both tensors are private copies).
On CUDA the device copy is ready once the event recorded after its upload has passed;
:meth:`CheckedIndex.on` makes the caller's current stream wait for it and records that
stream's use, so one index may serve several streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class CheckedIndex:
    """A 1-D int64 index: its host copy, its device copy and its checked properties.

    ``lo``/``hi`` are the smallest and largest value (0 and -1 when empty); ``unique``
    says no value repeats. Build with :meth:`of`; derive with :meth:`shifted`.
    """

    host: torch.Tensor
    device_tensor: torch.Tensor
    lo: int
    hi: int
    unique: bool
    ready: torch.cuda.Event | None = None

    @classmethod
    def of(cls, ids: Sequence[int] | torch.Tensor, device: torch.device | str) -> CheckedIndex:
        """Validate ``ids`` (ints, or an integer tensor on any device) and upload them.

        Raises ``ValueError`` for a negative value, a non-integer or non-1-D input."""
        host = host_index(ids, "an index", copy=True)
        lo, hi, unique = 0, -1, True
        if host.numel():
            lo, hi = int(host.min()), int(host.max())
            if lo < 0:
                raise ValueError(f"an index holds {lo}, below 0")
            unique = is_unique(host)
        return cls._upload(host, torch.device(device), lo, hi, unique)

    @classmethod
    def _upload(cls, host: torch.Tensor, dev: torch.device, lo: int, hi: int, unique: bool) -> CheckedIndex:
        if dev.type != "cuda":
            return cls(host, host if dev.type == "cpu" else host.to(dev), lo, hi, unique)
        on_dev = host.pin_memory().to(dev, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(dev))
        return cls(host, on_dev, lo, hi, unique, ready)

    @property
    def device(self) -> torch.device:
        return self.device_tensor.device

    def numel(self) -> int:
        return int(self.host.numel())

    def shifted(self, k: int) -> CheckedIndex:
        """The same index plus ``k`` (still unique if this one is): one addition on the host
        copy and, on CUDA, one on the current stream after this index's upload; no checks,
        no sort, no transfer."""
        if self.lo + k < 0 and self.numel():
            raise ValueError(f"shifting by {k} makes the index negative ({self.lo + k})")
        host = self.host + k
        if self.ready is None:
            on_dev = host if self.device_tensor is self.host else self.device_tensor + k
            return CheckedIndex(host, on_dev, self.lo + k, self.hi + k, self.unique)
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self.ready)
        on_dev = self.device_tensor + k
        ready = torch.cuda.Event()
        ready.record(stream)
        return CheckedIndex(host, on_dev, self.lo + k, self.hi + k, self.unique, ready)

    def on(self, device: torch.device) -> torch.Tensor:
        """The index as a tensor on ``device``, usable on its current stream.

        Raises ``ValueError`` when ``device`` is neither the host nor this index's device."""
        if device.type == "cpu":
            return self.host
        if device != self.device:
            raise ValueError(f"a checked index on {self.device} was passed for a move on {device}")
        if self.ready is not None:
            stream = torch.cuda.current_stream(device)
            stream.wait_event(self.ready)
            self.device_tensor.record_stream(stream)
        return self.device_tensor


def host_index(ids: Sequence[int] | torch.Tensor, name: str, *, copy: bool = False) -> torch.Tensor:
    """``ids`` as a 1-D int64 host tensor (``copy``: never a view of a caller's tensor).
    Raises ``ValueError`` naming ``name`` for a non-integer or non-1-D input. A CUDA
    tensor is copied to the host, which synchronises."""
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise ValueError(f"{name} must be an integer tensor, got dtype {ids.dtype}")
        if ids.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(ids.shape)}")
        return ids.detach().to("cpu", torch.int64, copy=copy)
    try:
        host = torch.as_tensor(list(ids), dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a sequence of ints: {exc}") from None
    if host.dim() != 1:
        raise ValueError(f"{name} must be a flat sequence of ints")
    return host


def is_unique(host: torch.Tensor) -> bool:
    """No value of the 1-D host tensor repeats. Strictly increasing (the usual case) proves
    it without a sort."""
    return bool((host[1:] > host[:-1]).all()) or torch.unique(host).numel() == host.numel()
