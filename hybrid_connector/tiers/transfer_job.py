"""What a layer-wise load hands back: ``LayerTransfer`` in, ``TransferJob`` out.

``LayerTransfer`` describes one layer's load; ``TransferJob`` tracks every layer of one
``CopyEngine.submit_layers`` call through pending, running, landed, failed or cancelled,
and its ``wait(name)`` is the only safe way to learn that a layer's data has landed. The
engine that moves the data, and the ordering, error and cancellation contract, are in
``hybrid_connector.tiers.copy_engine``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

FetchFn = Callable[[], torch.Tensor | None]
PostFn = Callable[[torch.Tensor], None]


class LayerTransferError(RuntimeError):
    """A layer's transfer failed; ``__cause__`` holds the original exception."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"layer {name!r}: {message}")
        self.layer = name


class LayerCancelledError(LayerTransferError):
    """A layer was cancelled (``cancel()``, an earlier failure, or ``close()``)."""


@dataclass
class LayerTransfer:
    """One layer's (or group's) load.

    Give exactly one of ``src`` (a tensor to copy, e.g. a pinned host buffer) and
    ``fetch`` (called on a worker thread; returns the source tensor, or ``None`` when
    it has already filled ``dst`` itself). Without ``dst`` the fetched tensor itself is
    the result. ``post`` runs after the copy, on the copy stream on CUDA.
    """

    name: str
    dst: torch.Tensor | None = None
    src: torch.Tensor | None = None
    fetch: FetchFn | None = None
    post: PostFn | None = None


class _State(Enum):
    PENDING = "pending"
    RUNNING = "running"
    LANDED = "landed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class _Layer:
    def __init__(self, transfer: LayerTransfer) -> None:
        self.transfer = transfer
        self.state = _State.PENDING
        self.error: BaseException | None = None
        self.result: torch.Tensor | None = None
        self.event: Any = None  # torch.cuda.Event once enqueued on CUDA
        self.settled = threading.Event()  # host side finished (any terminal state)


class TransferJob:
    """Readiness handle for one ``CopyEngine.submit_layers`` call. Thread-safe."""

    def __init__(
        self,
        device: torch.device,
        transfers: Sequence[LayerTransfer],
        cancel_on_error: bool,
    ) -> None:
        self._device = device  # the engine's device: whose current stream ``wait`` orders
        self._lock = threading.Lock()
        self._cancel_on_error = cancel_on_error
        self._order = [t.name for t in transfers]
        self._layers = {t.name: _Layer(t) for t in transfers}
        self.ready_event: Any = None  # CUDA: the submitter's stream at submit time

    @property
    def names(self) -> list[str]:
        """Layer names in submission order."""
        return list(self._order)

    def _layer(self, name: str) -> _Layer:
        try:
            return self._layers[name]
        except KeyError:
            raise KeyError(f"no layer named {name!r} in this job") from None

    def wait(
        self,
        name: str,
        timeout: float | None = None,
        *,
        stream: Any = None,
        sync: bool = False,
    ) -> torch.Tensor:
        """Return the landed tensor of ``name`` once its data is usable.

        CPU: blocks until the data is in place. CUDA: blocks until the copy is
        enqueued, then orders ``stream`` (default: the current stream of the
        engine's device) after it; ``sync=True`` also blocks until it completed.
        Raises ``LayerTransferError`` if the layer failed, ``LayerCancelledError`` if
        it was cancelled, ``TimeoutError`` after ``timeout`` seconds, ``KeyError``
        for an unknown name.
        """
        layer = self._layer(name)
        if not layer.settled.wait(timeout):
            raise TimeoutError(f"layer {name!r} not ready after {timeout} s")
        with self._lock:
            state, error, result, event = layer.state, layer.error, layer.result, layer.event
        if state is _State.CANCELLED:
            raise LayerCancelledError(name, "transfer was cancelled")
        if state is _State.FAILED:
            raise LayerTransferError(name, f"transfer failed: {error!r}") from error
        assert result is not None
        if event is not None:
            target = stream if stream is not None else torch.cuda.current_stream(self._device)
            target.wait_event(event)
            if sync:
                event.synchronize()
        return result

    def wait_all(self, timeout: float | None = None) -> None:
        """Wait for every layer in order (same errors as ``wait``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for name in self._order:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.wait(name, left)

    def cancel(self) -> int:
        """Cancel layers that have not started; return how many were cancelled."""
        return self._cancel_pending()

    def done(self) -> bool:
        """True when every layer is settled and (CUDA) every landed copy completed."""
        with self._lock:
            layers = list(self._layers.values())
        for layer in layers:
            if not layer.settled.is_set():
                return False
            if layer.event is not None and not layer.event.query():
                return False
        return True

    def errors(self) -> dict[str, BaseException]:
        """Failed layers and their exceptions (cancelled layers are not listed)."""
        with self._lock:
            return {
                n: layer.error
                for n, layer in self._layers.items()
                if layer.state is _State.FAILED and layer.error is not None
            }

    def status(self) -> dict[str, str]:
        """Each layer's state: pending, running, landed, failed or cancelled."""
        with self._lock:
            return {n: self._layers[n].state.value for n in self._order}

    # ------------------------------------------------------------ engine side

    def _cancel_pending(self) -> int:
        cancelled = 0
        with self._lock:
            for layer in self._layers.values():
                if layer.state is _State.PENDING:
                    layer.state = _State.CANCELLED
                    layer.transfer = LayerTransfer(layer.transfer.name)  # drop references
                    layer.settled.set()
                    cancelled += 1
        return cancelled

    def _start(self, name: str) -> LayerTransfer | None:
        with self._lock:
            layer = self._layers[name]
            if layer.state is not _State.PENDING:
                return None
            layer.state = _State.RUNNING
            return layer.transfer

    def _finish(self, name: str, result: torch.Tensor | None, event: Any, error: BaseException | None) -> None:
        with self._lock:
            layer = self._layers[name]
            if error is None:
                layer.state, layer.result, layer.event = _State.LANDED, result, event
            else:
                layer.state, layer.error = _State.FAILED, error
            layer.settled.set()
        if error is not None and self._cancel_on_error:
            self._cancel_pending()
