"""The one stand-in of the vLLM head-to-head: the workers' GPU copy routine, as a CPU copy.

vLLM 0.33's ``OffloadingConnector`` and ``SimpleCPUOffloadConnector`` copy blocks between
device and host with CUDA streams and batched DMA (``cpu/gpu_worker.py``,
``simple_kv_offload/copy_backend.py``), which a CPU-only machine cannot run. Everything
that decides a hit (their scheduler sides, ``CPUOffloadingManager``, the LRU/ARC policies,
the simple connector's host block pool, vLLM's ``Scheduler`` and KV cache manager) runs
unchanged; only the routine that moves the bytes is replaced here:

* :class:`CpuOffloadingWorker` implements vLLM's ``OffloadingWorker`` interface over the
  ``CanonicalKVCaches`` that vLLM's own ``OffloadingConnectorWorker.register_kv_caches``
  derives, with the host layout of ``CPUOffloadingWorker`` (direct layout: one host chunk
  row per canonical tensor, ``blocks_per_chunk`` device pages per row) and the same
  sub-block arithmetic (``block_indices`` skip into the first chunk). Copies complete
  synchronously, so every job is finished at the next ``get_finished``.
* :class:`CpuSimpleWorker` is vLLM's ``SimpleCPUOffloadWorker`` with its CUDA stream set-up
  and DMA backend replaced: the same per-allocation regions (``kv_cache_tensors``' block
  strides), the same event bookkeeping (``load_event`` / ``store_event`` high-water marks).

Each worker counts the bytes it moved (``loaded_bytes``, ``stored_bytes``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch


def _rows(ids: np.ndarray, per_chunk: int, skip: int, n: int) -> torch.Tensor:
    """Page rows of ``n`` logical blocks starting ``skip`` pages into chunk ``ids[0]``
    (vLLM's ``compute_sub_block_ptrs`` as row indices)."""
    ids = ids.astype(np.int64)
    if per_chunk == 1:
        return torch.from_numpy(ids[:n].copy())
    flat = (ids[:, None] * per_chunk + np.arange(per_chunk)[None, :]).ravel()
    return torch.from_numpy(flat[skip: skip + n].copy())


def offloading_worker_class() -> type:
    """:class:`CpuOffloadingWorker`, built on first use (vLLM is imported lazily)."""
    from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

    class CpuOffloadingWorker(OffloadingWorker):
        """vLLM's ``OffloadingWorker`` with the copy done by the CPU (module docstring)."""

        def __init__(self, kv_caches: Any, blocks_per_chunk: int, num_cpu_chunks: int,
                     region: Any = None) -> None:
            self.bpc = blocks_per_chunk
            self.refs = kv_caches.group_data_refs
            self.region = region
            self.dev: list[torch.Tensor] = []
            self.host: list[torch.Tensor] = []  # [chunk, page of the chunk, page bytes]
            for t in kv_caches.tensors:
                page = t.page_size_bytes
                self.dev.append(t.tensor.view(torch.int8).view(-1, page))
                if region is not None:  # CPUOffloadingWorker's mmap_region path
                    row = region.create_next_worker_view(page * blocks_per_chunk)
                else:
                    row = torch.zeros((num_cpu_chunks, page * blocks_per_chunk), dtype=torch.int8)
                self.host.append(row.view(num_cpu_chunks, blocks_per_chunk, page))
            self.done: list[Any] = []
            self.loaded_bytes = 0
            self.stored_bytes = 0
            # chunks a secondary tier wrote (promotions): their next load counts as from disk
            self.from_disk: set[int] = set()
            self.disk_loaded_bytes = 0

        def _copy(self, job_id: int, src: Any, dst: Any, to_host: bool) -> bool:
            t0 = time.perf_counter()
            gpu = src if to_host else dst
            src_ids, dst_ids = src.block_ids, dst.block_ids
            s_off = d_off = 0
            moved = 0
            s_per = 1 if to_host else self.bpc
            d_per = self.bpc if to_host else 1
            for g, (size, idx) in enumerate(zip(gpu.group_sizes, gpu.block_indices, strict=True)):
                if size == 0:
                    continue
                s_skip, d_skip = idx % s_per, idx % d_per
                s_n = -(-(size + s_skip) // s_per)
                d_n = -(-(size + d_skip) // d_per)
                s_rows = _rows(src_ids[s_off: s_off + s_n], s_per, s_skip, size)
                d_rows = _rows(dst_ids[d_off: d_off + d_n], d_per, d_skip, size)
                s_off, d_off = s_off + s_n, d_off + d_n
                h_rows = d_rows if to_host else s_rows
                hc, hs = h_rows // self.bpc, h_rows % self.bpc
                on_disk = (sum(int(c) in self.from_disk for c in hc.tolist())
                           if self.from_disk and not to_host else 0)
                for ref in self.refs[g]:
                    dev, host = self.dev[ref.tensor_idx], self.host[ref.tensor_idx]
                    n = ref.page_size_bytes  # the unpadded page, as vLLM copies it
                    if to_host:
                        host[hc, hs, :n] = dev[s_rows, :n]
                    else:
                        dev.narrow(1, 0, n).index_copy_(0, d_rows, host[hc, hs, :n])
                    moved += size * n
                    self.disk_loaded_bytes += on_disk * n
            assert s_off == len(src_ids) and d_off == len(dst_ids)
            if to_host:
                self.stored_bytes += moved
                self.from_disk.difference_update(int(c) for c in dst_ids)
            else:
                self.loaded_bytes += moved
                self.from_disk.difference_update(int(c) for c in src_ids)
            self.done.append(TransferResult(job_id, True, moved, time.perf_counter() - t0))
            return True

        def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            return self._copy(job_id, src_spec, dst_spec, True)

        def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any,
                        expedited: bool = False) -> bool:
            return self._copy(job_id, src_spec, dst_spec, False)

        def get_finished(self) -> list[Any]:
            out, self.done = self.done, []
            return out

        def wait(self, job_ids: set[int]) -> None:
            return None  # copies are synchronous

        def shutdown(self) -> None:
            if self.region is not None:
                self.host.clear()  # the views hold the mapping
                self.region.cleanup()
                self.region = None

    return CpuOffloadingWorker


def install_offloading_worker(connector: Any) -> None:
    """Make ``connector`` (an ``OffloadingConnector`` in the worker role) build the CPU-copy
    worker where its spec would build the CUDA one (``OffloadingSpec.get_worker``)."""
    spec = connector.connector_worker.spec
    cls = offloading_worker_class()
    holder: dict[str, Any] = {}

    def get_worker(kv_caches: Any) -> Any:
        if "w" not in holder:
            holder["w"] = cls(kv_caches, spec.blocks_per_chunk, spec.num_chunks)
        return holder["w"]

    spec.get_worker = get_worker


def install_tiering_worker(connector: Any) -> None:
    """The same for an ``OffloadingConnector`` with vLLM's ``TieringOffloadingSpec``: the
    CPU-copy worker copies into the ``SharedOffloadRegion`` that the spec's own
    ``create_worker`` maps (``tiering/spec.py``: same engine id, chunks, rank and page
    sizes), the file whose scheduler-side mapping the primary tier hands its secondary
    tiers, so the fs tier writes and reads the bytes this worker copies."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    spec = connector.connector_worker.spec
    cls = offloading_worker_class()
    holder: dict[str, Any] = {}

    def get_worker(kv_caches: Any) -> Any:
        if "w" not in holder:
            rank = 0 if spec.replicated_layout else spec.config.parallel.rank
            region = SharedOffloadRegion(
                engine_id=spec._engine_id, num_chunks=spec.num_chunks, rank=rank,
                kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
                cpu_page_size=spec.cpu_page_size_per_worker)
            holder["w"] = cls(kv_caches, spec.blocks_per_chunk, spec.num_chunks, region=region)
        return holder["w"]

    spec.get_worker = get_worker


def simple_worker_class() -> type:
    """:class:`CpuSimpleWorker`, built on first use (vLLM is imported lazily)."""
    from vllm.v1.simple_kv_offload.worker import SimpleCPUOffloadWorker

    class CpuSimpleWorker(SimpleCPUOffloadWorker):
        """vLLM's ``SimpleCPUOffloadWorker`` with the copies done by the CPU."""

        loaded_bytes = 0
        stored_bytes = 0

        def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
            # the regions of SimpleCPUOffloadWorker.register_kv_caches, without streams
            cfg = self.kv_cache_config
            assert cfg is not None
            num_blocks = cfg.num_blocks
            regions: list[torch.Tensor] = []
            seen: set[int] = set()
            for kt in cfg.kv_cache_tensors:
                name = next((n for n in kt.layers if n in kv_caches), None)
                if name is None:
                    continue
                span_blocks = num_blocks * kt.block_stride
                if kt.layer_stride >= span_blocks:
                    start, span = kt.offset, len(kt.layers) * kt.layer_stride
                else:
                    start, span = 0, span_blocks
                raw = torch.empty(0, dtype=torch.int8).set_(kv_caches[name].untyped_storage())
                for region in raw[start: start + span].view(-1, num_blocks, kt.block_stride):
                    if region.data_ptr() not in seen:
                        seen.add(region.data_ptr())
                        regions.append(region)
            per_block = sum(r.shape[1] for r in regions)
            self.num_cpu_blocks = (self._num_cpu_blocks_override
                                   or max(1, self.cpu_capacity_bytes // per_block))
            self.bytes_per_block = per_block
            self.dev = regions
            self.host = [torch.zeros((self.num_cpu_blocks, r.shape[1]), dtype=torch.int8)
                         for r in regions]

        def _move(self, src: list[int], dst: list[int], to_host: bool) -> None:
            s, d = torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)
            for dev, host in zip(self.dev, self.host, strict=True):
                a, b = (dev, host) if to_host else (host, dev)
                b.index_copy_(0, d, a.index_select(0, s))
            moved = len(src) * self.bytes_per_block
            if to_host:
                self.stored_bytes += moved
            else:
                self.loaded_bytes += moved

        def start_load_kv(self) -> None:
            m = self._connector_metadata
            if m is not None and m.load_cpu_blocks:
                self._move(m.load_cpu_blocks, m.load_gpu_blocks, False)
                self._load_hwm = max(self._load_hwm, m.load_event)

        def wait_for_save(self) -> None:
            m = self._connector_metadata
            if m is not None and m.store_gpu_blocks:
                self._move(m.store_gpu_blocks, m.store_cpu_blocks, True)
                self._store_hwm = max(self._store_hwm, m.store_event)

        def _flush_and_sync_all(self) -> None:
            return None  # nothing in flight

        def shutdown(self) -> None:
            return None

    return CpuSimpleWorker


def install_simple_worker(connector: Any) -> None:
    """Replace ``connector``'s (a ``SimpleCPUOffloadConnector`` in the worker role) worker
    handler with the CPU-copy one, keeping its configuration."""
    old = connector.worker_handler
    new = simple_worker_class()(old.vllm_config, old.kv_cache_config, old.cpu_capacity_bytes,
                                num_cpu_blocks=old._num_cpu_blocks_override)
    connector.worker_handler = new
