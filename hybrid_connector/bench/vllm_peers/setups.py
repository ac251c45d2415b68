"""The connectors of the head-to-head and how each is configured for one host budget.

Every peer is loaded through vLLM's ``KVConnectorFactory`` from a ``KVTransferConfig``, as
``--kv-transfer-config`` would; the budget is the same host bytes for every one:

* ``none``: vLLM's own prefix cache alone (no connector);
* ``offload-lru`` / ``offload-arc``: vLLM's ``OffloadingConnector`` with its default
  ``CPUOffloadingSpec`` (``cpu_bytes_to_use`` = the budget, ``eviction_policy`` ``lru`` or
  ``arc``; its other keys at their defaults, ``offload_prompt_only`` included);
* ``simple``: vLLM's ``SimpleCPUOffloadConnector`` (``cpu_bytes_to_use`` = the budget);
* ``ours``: ``HybridConnector`` with the shipped ``configs/vllm-qwen3_5.yaml`` (or
  ``vllm-nemotron_h.yaml``) taken to scale: ``chunk_size`` as many vLLM blocks as the
  shipped one (one), ``hash_block_size`` / ``alignment`` one block, no disk, and
  ``pools.host`` the budget split KV 24 : states 12 (the shipped split before ``kv_state``);
* ``ours-pooled``: the same with ``pools.host.kv_state`` = the budget (one pool KV and
  states share, what the shipped configs set now): labelled "HybridConnector (ours)",
  the split variant "HybridConnector, split pools".

Opt-in (``--peers``; not in the default sweep), a disk tier under each (``disk_peers``):

* ``offload-fs``: ``OffloadingConnector`` with vLLM's ``TieringOffloadingSpec``: its CPU
  primary tier of the same host bytes and a ``FileSystemTierManager`` ("fs") tier;
* ``ours-nvme``: ``ours-pooled`` plus an NVMe tier of a disk budget matched to what
  ``offload-fs``'s fs tier held (``disk_peers``).

Every ``ours*`` peer runs the auto-alpha tuner deterministic (``shadow_deterministic``), so
its figures repeat run to run. Opt-in, ``ours-shipped``: ``ours-pooled`` with the tuner as
the shipped configs run it (``shadow_deterministic: false``, ``shadow_cpu_share: 0.2``: it
skips requests it cannot keep up with, so its figures vary from run to run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PEERS = ("none", "offload-lru", "offload-arc", "simple", "ours", "ours-pooled")
DISK_PEERS = ("offload-fs", "ours-nvme")  # opt-in: host + disk tiers
SHIPPED_TUNER = "ours-shipped"  # opt-in: ours-pooled with the tuner as shipped
KNOWN = (*PEERS, *DISK_PEERS, SHIPPED_TUNER)  # every name ``peer`` accepts
LABELS = {
    "none": "vLLM prefix cache only",
    "offload-lru": "OffloadingConnector (LRU)",
    "offload-arc": "OffloadingConnector (ARC)",
    "simple": "SimpleCPUOffloadConnector",
    "ours": "HybridConnector, split pools",
    "ours-pooled": "HybridConnector (ours)",
    "ours-shipped": "HybridConnector, shipped tuner",
    "offload-fs": "OffloadingConnector + fs tier",
    "ours-nvme": "HybridConnector + NVMe tier",
}
VLLM_CLASSES = {
    "none": "Scheduler + KVCacheManager (align-mode prefix caching)",
    "offload-lru": "OffloadingConnector, OffloadingConnectorScheduler, CPUOffloadingSpec, "
                   "CPUOffloadingManager + LRUCachePolicy, OffloadingConnectorWorker",
    "offload-arc": "OffloadingConnector, OffloadingConnectorScheduler, CPUOffloadingSpec, "
                   "CPUOffloadingManager + ARCCachePolicy, OffloadingConnectorWorker",
    "simple": "SimpleCPUOffloadConnector, SimpleCPUOffloadScheduler (host BlockPool LRU)",
    "ours": "HybridConnector (hybrid_connector.integrations.vllm), both roles",
    "ours-pooled": "HybridConnector (hybrid_connector.integrations.vllm), both roles",
    "ours-shipped": "HybridConnector (hybrid_connector.integrations.vllm), both roles",
    "offload-fs": "OffloadingConnector, TieringOffloadingSpec, TieringOffloadingManager + "
                  "CPUPrimaryTierOffloadingManager (LRU) + FileSystemTierManager, "
                  "SharedOffloadRegion, OffloadingConnectorWorker",
    "ours-nvme": "HybridConnector (hybrid_connector.integrations.vllm), both roles, NvmeTier",
}
STAND_IN = {
    "offload-lru": "CPUOffloadingWorker's CUDA block copies -> CpuOffloadingWorker (CPU copy)",
    "offload-arc": "CPUOffloadingWorker's CUDA block copies -> CpuOffloadingWorker (CPU copy)",
    "simple": "SimpleCPUOffloadWorker's streams + DMA backend -> CpuSimpleWorker (CPU copy)",
    "offload-fs": "CPUOffloadingWorker's CUDA block copies -> CpuOffloadingWorker (CPU copy "
                  "into the spec's SharedOffloadRegion); the fs tier's file I/O is vLLM's own",
}
SHIPPED = {"qwen3.5-4b": "vllm-qwen3_5.yaml", "nemotron-h-8b": "vllm-nemotron_h.yaml"}


@dataclass(frozen=True)
class Peer:
    """One connector at one host budget: its ``KVTransferConfig`` as JSON (None: none)."""

    name: str
    budget: int
    transfer: dict[str, Any] | None


def ours_yaml(preset: str, block: int, budget: int, configs: Path, pooled: bool = False,
              deterministic: bool = True) -> str:
    """The shipped config for ``preset`` taken to the benchmark's scale (module docstring):
    ``pooled``: the host budget as one KV+state pool (``pools.host.kv_state``); else split
    KV 24 : states 12 (the shipped split before ``kv_state`` existed). ``deterministic``:
    the tuner's worker never skips a request (the same decisions in every run); False keeps
    the shipped tuner settings (it skips what it cannot keep up with)."""
    cfg = yaml.safe_load((configs / SHIPPED[preset]).read_text())
    chunk_blocks = shipped_chunk_blocks(preset, int(cfg["chunk_size"]))
    for k in ("local_disk", "max_local_disk_size", "disk_fsync", "disk_verify_reads", "remote_url"):
        cfg.pop(k, None)
    kv = int(budget * 24 / 36)
    host = ({"kv_state": f"{budget}B"} if pooled
            else {"kv": f"{kv}B", "state": f"{budget - kv}B", "anchor": "0B"})
    cfg.update({"chunk_size": chunk_blocks * block, "hash_block_size": block, "alignment": block,
                "local_cpu": True, "max_local_cpu_size": f"{budget}B", "pools": {"host": host}})
    if deterministic:
        cfg["shadow_deterministic"] = True
    return yaml.safe_dump(cfg, sort_keys=False)


def shipped_chunk_blocks(preset: str, chunk_size: int) -> int:
    """How many of vLLM 0.33's blocks for ``preset`` (bf16 on a GPU, align mode) a shipped
    ``chunk_size`` spans; ValueError when it is not a whole number of them (the connector
    would refuse to start: ``integrations.vllm.setup``)."""
    from hybrid_connector.geometry.presets import get_preset
    from hybrid_connector.geometry.scaled import cache_figures

    block = cache_figures(get_preset(preset)).block_size
    if chunk_size % block:
        raise ValueError(f"{SHIPPED[preset]}: chunk_size {chunk_size} is not a multiple of "
                         f"vLLM's block size {block} for {preset}")
    return chunk_size // block


def peer(name: str, budget: int, *, preset: str, block: int, work: Path, configs: Path,
         disk_budget: int | None = None, load_gate: dict[str, Any] | None = None) -> Peer:
    """``name`` (one of :data:`PEERS` or :data:`DISK_PEERS`) at ``budget`` host bytes
    (``disk_budget``: ``ours-nvme``'s disk bytes, ``load_gate`` its ``load_gate`` block,
    see ``disk_peers``)."""
    if name in DISK_PEERS:
        from hybrid_connector.bench.vllm_peers import disk_peers

        base = ours_yaml(preset, block, budget, configs, pooled=True)
        return Peer(name, budget, disk_peers.transfer(name, budget, work=work, ours=base,
                                                      shipped=configs / SHIPPED[preset],
                                                      disk_budget=disk_budget,
                                                      load_gate=load_gate))
    if name == "none":
        return Peer(name, budget, None)
    if name in ("offload-lru", "offload-arc"):
        extra: dict[str, Any] = {"cpu_bytes_to_use": budget,
                                 "eviction_policy": name.split("-")[1]}
        return Peer(name, budget, {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                   "kv_connector_extra_config": extra})
    if name == "simple":
        return Peer(name, budget, {"kv_connector": "SimpleCPUOffloadConnector",
                                   "kv_role": "kv_both",
                                   "kv_connector_extra_config": {"cpu_bytes_to_use": budget}})
    if name in ("ours", "ours-pooled", SHIPPED_TUNER):
        path = work / f"{name}-{budget}.yaml"
        path.write_text(ours_yaml(preset, block, budget, configs, pooled=name != "ours",
                                  deterministic=name != SHIPPED_TUNER))
        return Peer(name, budget, {"kv_connector": "HybridConnector",
                                   "kv_connector_module_path": "hybrid_connector.integrations.vllm",
                                   "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                                   "kv_connector_extra_config": {"config_file": str(path)}})
    raise ValueError(f"unknown peer {name!r}; known: {', '.join(KNOWN)}")


def install_stand_in(name: str, worker: Any) -> None:
    """Replace ``worker``'s GPU copy routine by the CPU one (``cpu_copy``)."""
    from hybrid_connector.bench.vllm_peers import cpu_copy as vc

    if name.startswith("offload"):
        vc.install_offloading_worker(worker)
    elif name == "simple":
        vc.install_simple_worker(worker)


def held_bytes(name: str, sched: Any, worker: Any) -> int:
    """Host bytes the connector holds now (its own accounting: chunks, blocks, pools)."""
    if name == "none" or worker is None:
        return 0
    if name.startswith("offload"):
        m = sched.connector.connector_scheduler.manager
        spec = worker.connector_worker.spec
        used = m._num_chunks - m._get_num_free_chunks()
        return int(used * spec.kv_bytes_per_chunk)
    if name == "simple":
        pool = sched.connector.scheduler_manager.cpu_block_pool
        used = sum(len(v) if isinstance(v, dict) else 1  # blocks holding a cached hash
                   for v in pool.cached_block_hash_to_block._cache.values())
        return int(used * worker.worker_handler.bytes_per_block)
    from hybrid_connector.core.keys import ObjectKind

    tiers = worker.worker.worker.executor.tiers.values()
    return int(sum(t.used(k) for t in tiers for k in ObjectKind))


def moved_bytes(name: str, worker: Any) -> tuple[int, int]:
    """(loaded, stored) bytes the stand-in copy moved (0, 0 for ``none`` and ours)."""
    if name.startswith("offload") and worker is not None:
        w = worker.connector_worker.worker
        return int(w.loaded_bytes), int(w.stored_bytes)
    if name == "simple" and worker is not None:
        w = worker.worker_handler
        return int(w.loaded_bytes), int(w.stored_bytes)
    return 0, 0
