"""Layer-wise asynchronous loads with per-layer readiness.

A ``CopyEngine`` moves the data of many layers (or layer groups) from a lower tier
into their destination tensors while the forward pass runs, and hands out a
``TransferJob`` whose ``wait(name)`` is the only safe way to learn that one layer's
data has landed.

How it moves data
-----------------
* Each ``LayerTransfer`` has a *host stage* and a *landing stage*. The host stage is
  ``fetch()`` (read NVMe, decompress, look up a remote tier), run on a bounded thread
  pool (on CUDA with the copy stream current, so GPU work it enqueues is covered by
  the layer's event); a transfer given ``src=`` instead has no host work. The landing stage copies
  the source into ``dst`` and runs the optional ``post(landed)`` hook (for example a
  scatter into paged KV blocks with ``kernels.scatter_kv_blocks``).
* On CUDA the landing stage is enqueued on a dedicated copy stream, which first waits
  for the work the submitting thread had enqueued on its current stream (so a copy
  never overwrites a buffer that earlier compute still reads), and a CUDA event is
  recorded after each layer. ``wait(name)`` blocks the host only until the layer's
  copy is *enqueued*, then makes the caller's stream wait on that event: every kernel
  the caller launches afterwards on that stream sees the landed data, and copies of
  later layers keep overlapping with it. Pass ``sync=True`` to also block the host.
  ``dst`` (and ``src`` when on the device) are registered with the copy stream
  (``record_stream``) so freeing them early cannot recycle memory under a copy.
* On CPU both stages run in the worker thread; ``wait(name)`` returns once the copy
  and ``post`` hook have finished.

Ordering
--------
Layers start in submission order (a FIFO pool), so with ``max_workers=1`` they also
land in order; with more workers they may land out of order, but a layer is never
reported ready before its own data has landed (CUDA: before its event is waited on).

Errors, cancellation, shutdown
------------------------------
* An exception raised by a layer's ``fetch``, copy or ``post`` marks that layer
  failed; ``wait`` on it raises ``LayerTransferError`` (the original exception is its
  ``__cause__``), and ``job.errors()`` lists it.
* With ``cancel_on_error=True`` (default) a failure cancels the job's layers that
  have not started yet (a load that lost one layer is recomputed anyway); layers
  already running still land and stay valid. With ``False`` every other layer is
  still delivered.
* ``job.cancel()`` cancels the layers that have not started; ``wait`` on them raises
  ``LayerCancelledError``. A running fetch is not interrupted; its data still lands.
* ``wait(timeout=...)`` raises ``TimeoutError``; ``engine.close()`` cancels whatever
  has not started and joins the workers, so no waiter can hang on a closed engine.

Caller contract: do not read or write ``dst`` of a layer before ``wait`` on it
returned; do not modify ``src`` until the layer is ready. Destination tensors of
cancelled or failed layers hold unspecified (possibly partial) data.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    """Readiness handle for one ``submit_layers`` call. Thread-safe."""

    def __init__(
        self,
        engine: CopyEngine,
        transfers: Sequence[LayerTransfer],
        cancel_on_error: bool,
    ) -> None:
        self._engine = engine
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
            target = stream if stream is not None else torch.cuda.current_stream(self._engine.device)
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


class CopyEngine:
    """Runs ``LayerTransfer`` lists asynchronously (see the module docstring).

    ``device``: where destinations live; ``"cuda"``/``"cuda:N"`` enables copy
    streams and events, anything else the thread-pool path. Default: the current
    CUDA device when available, else CPU. ``max_workers`` bounds concurrent host
    stages (fetches); ``num_streams`` copy streams are used round-robin per layer.
    """

    def __init__(
        self,
        max_workers: int = 2,
        device: torch.device | str | None = None,
        num_streams: int = 1,
    ) -> None:
        if max_workers < 1 or num_streams < 1:
            raise ValueError("max_workers and num_streams must be >= 1")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.is_cuda = dev.type == "cuda"
        self._streams: list[Any] = (
            [torch.cuda.Stream(device=dev) for _ in range(num_streams)] if self.is_cuda else []
        )
        self._next_stream = 0
        self._stream_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hc-copy")
        self._lock = threading.Lock()
        self._jobs: list[TransferJob] = []
        self._closed = False

    def __enter__(self) -> CopyEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit_layers(
        self,
        transfers: Sequence[LayerTransfer],
        *,
        cancel_on_error: bool = True,
    ) -> TransferJob:
        """Start loading ``transfers`` in order and return their ``TransferJob``.

        Raises ``ValueError`` for repeated names, a transfer with both or neither of
        ``src``/``fetch``, or ``src`` without ``dst``; ``RuntimeError`` once closed.
        """
        names = [t.name for t in transfers]
        if len(set(names)) != len(names):
            raise ValueError(f"layer names must be unique within a job: {names}")
        for t in transfers:
            if (t.src is None) == (t.fetch is None):
                raise ValueError(f"layer {t.name!r}: give exactly one of src= and fetch=")
            if t.src is not None and t.dst is None:
                raise ValueError(f"layer {t.name!r}: src= needs a dst=")
        job = TransferJob(self, transfers, cancel_on_error)
        with self._lock:
            if self._closed:
                raise RuntimeError("CopyEngine is closed")
            self._jobs = [j for j in self._jobs if not j.done()] + [job]
            if self.is_cuda:
                job.ready_event = torch.cuda.Event()
                job.ready_event.record(torch.cuda.current_stream(self.device))
            inline = [t.name for t in transfers if self.is_cuda and t.fetch is None and self._enqueue_inline(t.src)]
            if inline:
                self._run_inline(job, inline)  # nothing for a thread to do: enqueue now
            skip = set(inline)
            for t in transfers:
                if t.name not in skip:
                    self._pool.submit(self._run, job, t.name)
        return job

    def close(self) -> None:
        """Cancel all layers not yet started, then join the worker threads."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs)
        for job in jobs:
            job._cancel_pending()
        self._pool.shutdown(wait=True)
        for stream in self._streams:
            stream.synchronize()

    # ------------------------------------------------------------ internals

    def _enqueue_inline(self, src: torch.Tensor | None) -> bool:
        # Device tensors and pinned host tensors copy asynchronously; a pageable host
        # copy would block the submitter, so it goes to a worker instead.
        return src is not None and (src.device.type == "cuda" or src.is_pinned())

    def _stream(self) -> Any:
        stream = self._streams[self._next_stream % len(self._streams)]
        self._next_stream += 1
        return stream

    def _run(self, job: TransferJob, name: str) -> None:
        t = job._start(name)
        if t is None:
            return  # cancelled before it started
        try:
            if self.is_cuda:
                result, event = self._execute_cuda(job, t)
            else:
                source = t.fetch() if t.fetch is not None else t.src
                result, event = self._land(t, source, non_blocking=False), None
        except BaseException as exc:  # noqa: BLE001 - reported per layer, never lost
            job._finish(name, None, None, exc)
            return
        job._finish(name, result, event, None)

    def _run_inline(self, job: TransferJob, names: list[str]) -> None:
        """Enqueue device/pinned copies from the submitting thread, in order, entering
        the stream context once (per-layer Python overhead delays the caller's next
        kernels, so it is kept to a few microseconds)."""
        with self._stream_lock:
            stream = self._stream()
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            stream.wait_event(job.ready_event)
            for name in names:
                t = job._start(name)
                if t is None:
                    continue
                try:
                    result = self._land(t, t.src, non_blocking=True)
                    for tensor in (t.dst, t.src, result):
                        if tensor is not None and tensor.device.type == "cuda":
                            tensor.record_stream(stream)
                    event = torch.cuda.Event()
                    event.record(stream)
                except BaseException as exc:  # noqa: BLE001 - reported per layer
                    job._finish(name, None, None, exc)
                    continue
                job._finish(name, result, event, None)

    def _land(self, t: LayerTransfer, source: torch.Tensor | None, *, non_blocking: bool) -> torch.Tensor:
        if t.dst is not None:
            if source is not None:
                t.dst.copy_(source, non_blocking=non_blocking)
            result = t.dst
        elif source is None:
            raise ValueError("fetch returned None and the layer has no dst")
        else:
            result = source
        if t.post is not None:
            t.post(result)
        return result

    def _execute_cuda(self, job: TransferJob, t: LayerTransfer) -> tuple[torch.Tensor, Any]:
        with self._stream_lock:
            stream = self._stream()
        # fetch, copy and post all run with the copy stream current, so any CUDA work
        # they enqueue is ordered after the submitter's earlier work and before the
        # layer's event
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            stream.wait_event(job.ready_event)
            source = t.fetch() if t.fetch is not None else t.src
            result = self._land(t, source, non_blocking=True)
            for tensor in (t.dst, source, result):
                if tensor is not None and tensor.device.type == "cuda":
                    tensor.record_stream(stream)
            event = torch.cuda.Event()
            event.record(stream)
        return result, event
