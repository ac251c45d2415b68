"""HybridConnector: vLLM's KV connector (``KVConnectorBase_V1`` + ``SupportsHMA``) for
hybrid models, over this project's index (scheduler process) and tiers (each TP worker).

Load it with::

    --kv-transfer-config '{"kv_connector": "HybridConnector",
      "kv_connector_module_path": "hybrid_connector.integrations.vllm",
      "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"config_file": "configs/vllm-qwen3_5.yaml"}}'

(or the YAML path in ``HYBRID_CONNECTOR_CONFIG``). This module and its ``vllm_*`` siblings
are the only ones that import vLLM: ``vllm_setup`` (start-up checks), ``vllm_scheduler``
(the index side), ``vllm_worker`` (the byte side), ``vllm_meta`` (what crosses between).
Every vLLM quirk handled is written down where it is handled.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_events import KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from hybrid_connector.integrations.vllm.events import kv_events
from hybrid_connector.integrations.vllm.meta import HybridConnectorMetadata, HybridWorkerMetadata
from hybrid_connector.integrations.vllm.pages import attention_backends
from hybrid_connector.integrations.vllm.scheduler import SchedulerSide
from hybrid_connector.integrations.vllm.setup import (
    HybridStartupError,
    check_engine,
    geometry_of,
    groups_of,
    hybrid_config,
    model_id_of,
)
from hybrid_connector.integrations.vllm.stats import HybridPromMetrics, HybridStats
from hybrid_connector.integrations.vllm.worker import WorkerSide
from hybrid_connector.runtime.ranks import LoadReport, RankWorker

__all__ = ["HybridConnector", "HybridStartupError"]

class HybridConnector(KVConnectorBase_V1, SupportsHMA):
    """See the module docstring. One instance per process: the scheduler role holds the
    index, the worker role one rank's tiers."""

    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        if ktc is not None and ktc.kv_load_failure_policy != "recompute":
            raise HybridStartupError(
                'HybridConnector is a best-effort cache: set "kv_load_failure_policy": '
                '"recompute" in --kv-transfer-config so a failed load is recomputed')
        self.config = hybrid_config(vllm_config)
        check_engine(vllm_config, self.config)
        self.geometry = geometry_of(vllm_config, self.config)
        self.groups = groups_of(kv_cache_config, self.geometry)
        hash_block = kv_cache_config.hash_block_size or self.groups.block_size
        layout = {"engine": "vllm", "block": self.groups.block_size, "state_order": "vllm",
                  "hashes": f"vllm:{vllm_config.cache_config.prefix_caching_hash_algo}:{hash_block}"}
        self.sched: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            tp = vllm_config.parallel_config.tensor_parallel_size
            self.sched = SchedulerSide(self.config, self.geometry, self.groups, tp, hash_block, layout,
                                       model_id_of(vllm_config, self.config))
            self.sched.events = kv_events(vllm_config, kv_cache_config, self.sched.index,
                                          self.groups, hash_block)
            # ``kv_consumer`` (a decode instance fed by a shared tier): loads, saves nothing,
            # as vLLM itself finalizes partial tails for producers only
            self.sched.saving = ktc is None or ktc.is_kv_producer
        else:
            from hybrid_connector.tiers.configured import build_tiers
            from hybrid_connector.tiers.executor import Executor

            rank = _tp_rank(vllm_config)
            disk = _disk_dir(self.config.disk_path, vllm_config.parallel_config, rank)
            tiers = build_tiers(self.config, device=_device(), disk_path=disk)
            self.worker = WorkerSide(self.geometry, self.groups, RankWorker(rank, Executor(tiers)),
                                     kv_cache_config.num_blocks)
        self._recving: set[str] = set()
        self._sending: set[str] = set()  # finished requests whose tail saves were copied
        self._failed: set[str] = set()
        self._inventory_sent = False
        self._load_reports: list[tuple[int, LoadReport]] = []

    # ================================================================ worker side
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        assert self.worker is not None
        specs = {n: g.kv_cache_spec for g in self._kv_cache_config.kv_cache_groups
                 for n in g.layer_names}
        names = [n for _, n in self.groups.attention]
        self.worker.register(kv_caches, specs, attention_backends(self._vllm_config, names))

    def _meta(self) -> HybridConnectorMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, HybridConnectorMetadata)
        return meta

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Loads of this step, whole (Mamba layers get no per-layer hooks); the requests
        are waiting for them (async hits), so nothing reads their blocks meanwhile."""
        assert self.worker is not None
        meta = self._meta()
        for job in meta.loads:
            rep, failed = self.worker.load(job)
            self._load_reports.append((job.job, rep))
            self._recving.add(job.req_id)
            if failed:
                self._failed.add(job.req_id)
        self.worker.run_ops(meta.ops)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return None  # saves copy whole chunks in wait_for_save, after the forward

    def wait_for_save(self) -> None:
        assert self.worker is not None
        meta = self._meta()
        for job in meta.saves:
            self.worker.save(job)
        self._sending.update(meta.hold)  # copied out: vLLM may free those blocks now

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        res = self.get_transfer_results(finished_req_ids)
        return res.finished_sending or None, res.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Loads done this step; a failed one is named in ``failed_recving`` (vLLM refuses
        block-level ``invalid_block_ids`` with several KV cache groups: block ids repeat
        across groups) and, with ``kv_load_failure_policy=recompute``, recomputed."""
        done, self._recving = self._recving, set()
        failed, self._failed = self._failed, set()
        sent, self._sending = self._sending, set()
        return KVConnectorTransferResults(finished_sending=sent, finished_recving=done,
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()  # failures go by request (get_transfer_results)

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        assert self.worker is not None
        reps, self._load_reports = self._load_reports, []
        ops = self.worker.take_reports()
        inv = []
        if not self._inventory_sent:  # once: a warm restart's objects, for the index
            self._inventory_sent = True
            inv = [(self.worker.worker.rank, self.worker.inventory())]
        return HybridWorkerMetadata(ops, reps, inv) if ops or reps or inv else None

    # ================================================================ scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        assert self.sched is not None
        return self.sched.match(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self.sched is not None
        self.sched.allocated(request, lambda: tuple(tuple(x) for x in blocks.get_block_ids()),
                             num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self.sched is not None
        return self.sched.build_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        assert self.sched is not None
        meta = connector_output.kv_connector_worker_meta
        self.sched.reports(meta if isinstance(meta, HybridWorkerMetadata) else None)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        assert self.sched is not None
        # other saves were copied out of the blocks in their own step; the end-of-request
        # tail is copied in the next one, so vLLM keeps the blocks until finished_sending
        return self.sched.finished(request, tuple(tuple(x) for x in block_ids)), None

    def reset_cache(self) -> bool | None:
        """vLLM's connector reset (``SchedulerSide.reset``); None on a worker (nothing to do:
        removals reach it with the next step's metadata)."""
        return self.sched.reset() if self.sched is not None else None

    def register_finished_partial_tail(self, request: Any, block_ids: tuple[list[int], ...],
                                       partial_tail_offloads: list[tuple[int, int, int]]) -> bool:
        """vLLM's exact blocks for the state at the request's last token (when its own cache
        keyed a partial tail there): recorded for ``request_finished_all_groups``, which
        vLLM calls next and which returns whether the blocks are held for the copy."""
        assert self.sched is not None
        self.sched.partial_tail(request, partial_tail_offloads)
        return False

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int
                                       ) -> dict[CacheHitSource, int]:
        """The external tokens by the tier they were loaded from (vLLM's per-source hit
        metrics)."""
        if num_external_tokens == 0 or self.sched is None:
            return {}
        got = self.sched.sources_of(request.request_id)
        if not got or sum(got.values()) != num_external_tokens:
            return {CacheHitSource.EXTERNAL_UNSPECIFIED: num_external_tokens}
        return dict(got)

    # ================================================================ telemetry
    def take_events(self) -> Iterable[KVCacheEvent]:
        """vLLM's KV events for what the tiers hold (``events.py``); none unless enabled."""
        ev = self.sched.events if self.sched is not None else None
        return ev.take() if ev is not None else ()

    def get_kv_connector_stats(self) -> HybridStats | None:
        return self.worker.take_stats() if self.worker is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> HybridStats | None:
        return HybridStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict[type, type],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                           ) -> HybridPromMetrics:
        return HybridPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped save is a future miss

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """Off unless ``extra_config: {divergent_hits: true}``. When on, vLLM passes its
        local full-attention hit even where it runs deeper than its Mamba hit; a hit
        reported here carries the exact state at its end, so the lagging recurrent groups
        are restored, and vLLM's deeper attention blocks count too. But a hit can only be
        reported past the attention hit: where our state lies between vLLM's Mamba and
        attention hits, vLLM reconciles down and our hit is lost (measured in
        tests/vllm: 3+ hits became 0-1 on the concurrent traces), hence off by default."""
        return bool(self.config.extra_config.get("divergent_hits", False))

    def shutdown(self) -> None:
        if self.sched is not None:
            self.sched.close()
        if self.worker is not None:
            self.worker.flush(5.0)
            self.worker.worker.executor.close()


def _tp_rank(vllm_config: VllmConfig) -> int:
    """This worker's tensor-parallel rank: from vLLM's TP group once it exists, else from
    the global rank vLLM's ``WorkerBase`` sets (TP is the fastest-varying dimension)."""
    try:
        from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

        if model_parallel_is_initialized():
            return int(get_tp_group().rank_in_group)
    except ImportError:
        pass
    pc = vllm_config.parallel_config
    return int(pc.rank) % max(1, int(pc.tensor_parallel_size))


def _disk_dir(root: str | None, pc: Any, rank: int) -> str | None:
    """This worker's NVMe directory: ``<local_disk>/rank<r>``, under ``dp<d>/`` when vLLM
    runs data-parallel engines (each its own scheduler and index; on one node they would
    otherwise share, and lock each other out of, one directory)."""
    if not root:
        return None
    dp = int(getattr(pc, "data_parallel_size", 1) or 1)
    return f"{root}/dp{int(pc.data_parallel_rank or 0)}/rank{rank}" if dp > 1 else f"{root}/rank{rank}"


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
