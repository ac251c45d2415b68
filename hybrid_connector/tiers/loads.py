"""Per-object async loads: ``LoadHandle`` waits on one object of a batch at a time."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.tiers.copy_engine import LayerTransferError, TransferJob


class Miss(Exception):
    """A key was not readable (turned into ``None`` by ``LoadHandle.wait``)."""


class LoadHandle:
    """Per-object readiness of an async load. ``wait(i)`` returns object ``i``'s tensor
    (the caller's buffer for ``get_into_async``) once it has landed, or ``None`` when it
    was missing or unreadable; it raises ``TimeoutError`` only when ``timeout`` expires.
    On CUDA, ``wait`` makes the current stream wait on the copy (``sync=True`` also blocks
    the host). Buffers must not be touched before their ``wait`` returned."""

    def __init__(self, job: TransferJob, keys: Sequence[ObjectKey]) -> None:
        self._job = job
        self.keys = list(keys)

    def wait(self, index: int, timeout: float | None = None, sync: bool = False) -> torch.Tensor | None:
        if not 0 <= index < len(self.keys):
            raise IndexError(f"object index {index} outside [0, {len(self.keys)})")
        try:
            return self._job.wait(str(index), timeout, sync=sync)
        except LayerTransferError:
            return None

    def wait_all(self, timeout: float | None = None) -> list[torch.Tensor | None]:
        return [self.wait(i, timeout) for i in range(len(self.keys))]

    def done(self) -> bool:
        return self._job.done()

    def cancel(self) -> int:
        """Cancel the loads not started yet (their ``wait`` returns None)."""
        return self._job.cancel()
