"""The worker side of the vLLM connector, one per TP rank: moves bytes between vLLM's paged
buffers and this rank's tiers: KV through the payload layout's paged gather/scatter
(``hybrid_connector.payload.paged``), state pages through ``kernels.copy_state_pages``
(CUDA on GPU, the torch fallbacks on CPU).

vLLM hands ``register_kv_caches`` the per-layer ``[B, H, N, C]`` views ``allocate_kv_cache``
makes of one int8 allocation every group aliases (``vllm_pages``): an attention layer's is
viewed in place as ``[2, blocks, block_size, heads, head_size]`` by its backend's K/V
packing, a Mamba/GDN layer's is sliced into its state tensors (each ``[blocks, ...]``:
block b holds the layer's whole state as of a block boundary in align mode) as the layer
itself slices it. A state payload here is those pages back to back in vLLM's own shapes
(its conv state is ``[kernel - 1, channels]``, the transpose of the geometry's
``[channels, kernel - 1]``: same bytes, so the size check against the geometry holds and
the engine-specific byte order goes into the index's fingerprint, never meeting payloads
of the transformers runtime). Only the addressed tokens' K/V and the addressed state bytes
are read or written: never another group's page, nor a page's padding.

Contract: ``load`` writes only the blocks of its job (KV of ``[start, end)``, the state at
``end``) and reports a job failed (never raises) when a shard is missing, short or does
not fit; ``save`` copies its objects out of the blocks before returning, so vLLM may reuse
the blocks as soon as ``wait_for_save`` returns while the tier I/O runs on the lanes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from hybrid_connector import kernels
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.geometry.layers import TensorSpec
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.integrations.vllm.meta import Held, LoadJob, SaveJob, SaveObject
from hybrid_connector.integrations.vllm.pages import kv_view, state_views
from hybrid_connector.integrations.vllm.setup import Groups, HybridStartupError, layer_index
from hybrid_connector.integrations.vllm.stats import HybridStats
from hybrid_connector.payload.layout import PayloadLayout, kv_layout, kv_layout_of
from hybrid_connector.payload.paged import gather_paged_kv, scatter_paged_kv
from hybrid_connector.runtime.ranks import LoadReport, OpReport, RankWorker

log = logging.getLogger(__name__)

KV_FIRST = "kv_first"  # what ``pages.kv_view`` makes of every backend's pages


class WorkerSide:
    """One rank's byte mover (see the module docstring). Thread safe for reports only."""

    def __init__(self, geometry: ModelGeometry, groups: Groups, worker: RankWorker,
                 num_blocks: int) -> None:
        self.geometry = geometry
        self.groups = groups
        self.worker = worker
        self.num_blocks = num_blocks
        self.kv: list[tuple[int, torch.Tensor, str]] = []       # (group, cache, layout)
        self.states: list[tuple[int, list[torch.Tensor]]] = []  # (group, state tensors)
        self.state_layout: PayloadLayout | None = None
        self._lock = threading.Lock()
        self._reports: list[OpReport] = []
        self.stats = HybridStats()

    # ---------------------------------------------------------------- registration
    def register(self, caches: Mapping[str, torch.Tensor], specs: Mapping[str, Any],
                 backends: Mapping[str, str | None]) -> None:
        """Take vLLM's buffers: ``caches`` as ``register_kv_caches`` receives them, ``specs``
        each layer's KV cache spec (its group's), ``backends`` each attention layer's
        backend name (None: unknown, read as ``[K | V]`` content). Raises
        HybridStartupError for a layer missing or of an unexpected shape, and for state
        pages whose bytes differ from the geometry's."""
        for g, name in self.groups.attention:
            if name not in caches:
                raise HybridStartupError(f"no paged KV tensor registered for {name}")
            view = kv_view(name, caches[name], specs[name], self.num_blocks, backends.get(name))
            self.kv.append((g, view, KV_FIRST))
        tensors: list[TensorSpec] = []
        for g, name in self.groups.recurrent:
            if name not in caches:
                raise HybridStartupError(f"no state pages registered for {name}")
            ts = state_views(name, caches[name], specs[name], self.num_blocks)
            i = layer_index(name)
            for j, t in enumerate(ts):
                tensors.append(TensorSpec(f"layers.{i}.s{j}", tuple(t.shape[1:]),
                                        str(t.dtype).removeprefix("torch.")))
            self.states.append((g, ts))
        if tensors:
            self.state_layout = PayloadLayout.of(ObjectKind.STATE, tensors)
            if self.state_layout.nbytes != self.geometry.state_bytes():
                raise HybridStartupError(
                    f"vLLM's state pages hold {self.state_layout.nbytes} B, the geometry "
                    f"{self.geometry.name} {self.geometry.state_bytes()} B per rank")

    # ---------------------------------------------------------------- KV
    def _kv_ids(self, block_ids: tuple[tuple[int, ...], ...], g: int, a: int, b: int) -> list[int]:
        bs = self.groups.block_size
        ids = list(block_ids[g][a // bs : -(-b // bs)])
        if len(ids) != -(-(b - a) // bs) or a % bs:
            raise ValueError(f"tokens [{a}, {b}) are not covered by group {g}'s blocks")
        return ids

    def _caches(self) -> list[torch.Tensor]:
        return [cache for _, cache, _ in self.kv]

    def _tables(self, block_ids: tuple[tuple[int, ...], ...], a: int, b: int) -> list[list[int]]:
        """Each attention layer's blocks of tokens ``[a, b)`` (its group's block table)."""
        return [self._kv_ids(block_ids, g, a, b) for g, _, _ in self.kv]

    def gather_kv(self, block_ids: tuple[tuple[int, ...], ...], a: int, b: int) -> torch.Tensor:
        """The KV of tokens ``[a, b)`` (``a`` block aligned) as a payload of
        ``kv_layout(geometry, b - a)`` (``payload.paged.gather_paged_kv``)."""
        return gather_paged_kv(kv_layout(self.geometry, b - a), self._caches(),
                               self._tables(block_ids, a, b), block_layout=KV_FIRST)

    def scatter_kv(self, payload: torch.Tensor, start: int, block_ids: tuple[tuple[int, ...], ...],
                   a: int, b: int) -> None:
        """Write tokens ``[a, b)`` of a KV chunk payload beginning at token ``start`` into
        the request's blocks (``a`` block aligned; a partial last block keeps its other
        slots; ``payload.paged.scatter_paged_kv``)."""
        scatter_paged_kv(kv_layout_of(self.geometry, payload), payload, self._caches(), self._tables(block_ids, a, b),
                         block_layout=KV_FIRST, tokens=(a - start, b - start))

    # ---------------------------------------------------------------- states
    def gather_state(self, blocks: Mapping[int, int]) -> torch.Tensor:
        """The state pages of block ``blocks[g]`` of every recurrent group ``g``."""
        assert self.state_layout is not None
        payload, views = self.state_layout.allocate(self.states[0][1][0].device)
        for (g, ts), (_, name) in zip(self.states, self.groups.recurrent, strict=True):
            i = layer_index(name)
            dst = [views[f"layers.{i}.s{j}"].unsqueeze(0) for j in range(len(ts))]
            kernels.copy_state_pages(ts, dst, [blocks[g]], [0])
        return self.state_layout.commit(payload, views)

    def scatter_state(self, payload: torch.Tensor, blocks: Mapping[int, int]) -> None:
        """Write a state payload into block ``blocks[g]`` of every recurrent group ``g``."""
        assert self.state_layout is not None
        dev = self.states[0][1][0].device
        parts = self.state_layout.unpack(payload.to(dev))
        for (g, ts), (_, name) in zip(self.states, self.groups.recurrent, strict=True):
            i = layer_index(name)
            src = [parts[f"layers.{i}.s{j}"].unsqueeze(0).contiguous() for j in range(len(ts))]
            kernels.copy_state_pages(src, ts, [0], [blocks[g]])

    # ---------------------------------------------------------------- jobs
    def load(self, job: LoadJob) -> tuple[LoadReport, bool]:
        """Run one load; returns this rank's report and whether the load failed here."""
        if not job.keys:
            self.stats.add("failed_loads")
            return LoadReport(job.job, self.worker.rank), True
        got, rep = self.worker.load(job.job, job.keys, job.tiers, job.sizes)
        if rep.failed:
            self.stats.add("failed_loads")
            return rep, True
        bs = self.groups.block_size
        try:
            for key, data in zip(job.keys, got, strict=True):
                assert data is not None
                if key.kind is ObjectKind.KV:
                    a, b = max(key.start, job.start), min(key.end, job.end)
                    if a < b:
                        self.scatter_kv(data, key.start, job.block_ids, a, b)
                elif key.kind is ObjectKind.STATE:
                    # the block preprocess_mamba reads a hit of ``end`` tokens from (an
                    # end-of-request tail's ``end`` may lie inside it)
                    idx = (job.end - 1) // bs
                    blk = {g: job.block_ids[g][idx] for g in self.groups.recurrent_groups}
                    self.scatter_state(data, blk)
        except (ValueError, RuntimeError, IndexError):
            log.exception("load of request %s failed on rank %d", job.req_id, self.worker.rank)
            self.stats.add("failed_loads")
            return LoadReport(job.job, self.worker.rank, tuple(job.keys), ()), True
        self.stats.add("load_jobs")
        self.stats.add("loaded_bytes", sum(job.sizes))
        for tier in job.tiers:
            self.stats.add(f"loaded_from_{tier}")
        return rep, False

    def payload(self, job: SaveJob, obj: SaveObject) -> torch.Tensor:
        if obj.kind is ObjectKind.KV:
            return self.gather_kv(job.block_ids, obj.start, obj.end)
        return self.gather_state(dict(obj.state_blocks))

    def save(self, job: SaveJob) -> None:
        """Copy the job's objects out of the blocks, then queue its ops (reports later)."""
        payloads: dict[ObjectKey, torch.Tensor] = {}
        for obj in job.objects:
            payloads[obj.key] = self.payload(job, obj)
            self.stats.add("saved_objects")
            self.stats.add("saved_bytes", payloads[obj.key].numel() * payloads[obj.key].element_size())
        self.worker.run(job.batch, payloads, self._report)

    def run_ops(self, batches: Sequence[object]) -> None:
        for batch in batches:
            self.worker.run(batch, {}, self._report)  # type: ignore[arg-type]

    def _report(self, rep: OpReport) -> None:
        with self._lock:
            self._reports.append(rep)

    def take_stats(self) -> HybridStats | None:
        """This interval's counters (None when nothing happened); starts a new interval."""
        out, self.stats = self.stats, HybridStats()
        return None if out.is_empty() else out

    def inventory(self) -> list[Held]:
        """What this rank's persistent local tiers (NVMe) hold from a previous run, oldest
        first per kind (the scheduler adopts and re-links it: a warm restart)."""
        out: list[Held] = []
        for name, t in self.worker.executor.tiers.items():
            if getattr(t, "slow", False) and not getattr(t, "shared", False):
                out.extend((k, n, m, name) for k, n, m in t.inventory())
        return out

    def take_reports(self) -> list[OpReport]:
        with self._lock:
            out, self._reports = self._reports, []
        return out

    def flush(self, timeout: float | None = None) -> None:
        self.worker.executor.flush(timeout)


SendFn = Callable[[OpReport], None]
