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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from hybrid_connector.tiers.transfer_job import (
    FetchFn,
    LayerCancelledError,
    LayerTransfer,
    LayerTransferError,
    PostFn,
    TransferJob,
)

__all__ = [
    "CopyEngine",
    "FetchFn",
    "LayerCancelledError",
    "LayerTransfer",
    "LayerTransferError",
    "PostFn",
    "TransferJob",
]


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
        job = TransferJob(self.device, transfers, cancel_on_error)
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
