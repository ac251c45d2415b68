"""What a run of a host + disk peer (``disk_peers``) adds to ``run.run_one``: the stand-in,
one settle per engine step, host and disk bytes, and the bytes loaded from disk.

``offload-fs``. The stand-in is ``cpu_copy.install_tiering_worker`` (the CPU copy into the
spec's ``SharedOffloadRegion``); the fs tier's lookups and file I/O are vLLM's own and run
on their own threads (``FsAsyncLookupManager``'s thread, ``DualQueueThreadPool``). So that
a run does not depend on how fast those threads are, :meth:`DiskRun.after_step` waits,
after each engine step, until every lookup vLLM posted that step has its answer applied
(vLLM's own ``drain_results``, which the next step's first lookup would call anyway) and
every store and promotion job it submitted has finished (vLLM's own ``drain_jobs``): disk
I/O finishes within one engine step. The scheduler then sees the results at the points
it polls them, exactly as vLLM's code decides. Which primary-tier chunks a promotion
(fs tier -> CPU tier) filled is recorded from the fs tier's ``submit_load``; the first
copy of such a chunk into vLLM's blocks counts as bytes loaded from disk.

``ours-nvme``. Its tier ops (saves, demotions to the NVMe tier, promotions) run on the
executor's threads; after each engine step the runner waits for every op submitted so far
(the connector's own ``WorkerSide.flush``, what its shutdown calls, as for every run of
ours: ``run._drive``), the same assumption as above. Bytes loaded from disk are the NVMe-planned objects of each load
job that succeeded (``LoadJob.tiers`` / ``sizes``), counted around ``WorkerSide.load``.

Both: host bytes held count the host tier only; disk bytes are those the disk tier's own
accounting holds (fs tier: its block files, each one page-aligned chunk; ours: the NVMe
tier's payload bytes) and ``disk_file_bytes`` what the directory holds on disk (ours: plus
one header and the object's metadata per file). The directory is removed afterwards.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from hybrid_connector.bench.vllm_peers import disk_peers as dp

SETTLE_TIMEOUT_S = 120.0


class DiskRun:
    """One run of disk peer ``name`` whose disk tier lives in ``root``."""

    def __init__(self, name: str, transfer_cfg: dict[str, Any]) -> None:
        self.name = name
        self.root = dp.disk_dir(name, transfer_cfg)
        self.fs = name == "offload-fs"
        self.tier: Any = None  # vLLM's FileSystemTierManager (offload-fs)
        self.side: Any = None  # our connector's WorkerSide (ours-nvme)
        self.copier: Any = None  # the CPU-copy worker (offload-fs)
        self.disk_loaded = 0  # ours: bytes of NVMe-planned objects loaded
        self.promoted_chunks = 0  # offload-fs: chunks the fs tier read back
        self.peak = 0

    # ---------------------------------------------------------------- set-up
    def install(self, worker: Any) -> None:
        """The stand-in (``offload-fs``; ours has none)."""
        from hybrid_connector.bench.vllm_peers import cpu_copy as vc

        if self.fs:
            vc.install_tiering_worker(worker)

    def attach(self, sched: Any, worker: Any) -> None:
        """Count bytes from disk (after both sides exist and the caches are registered)."""
        if self.fs:
            self.tier = sched.connector.connector_scheduler.manager.secondary_tiers[0]
            self.copier = worker.connector_worker.worker
            submit = self.tier.submit_load

            def submit_load(job: Any) -> None:
                self.copier.from_disk.update(int(c) for c in job.chunk_ids)
                self.promoted_chunks += len(job.chunk_ids)
                submit(job)

            self.tier.submit_load = submit_load
            return
        side = self.side = worker.worker
        load = side.load

        def counted(job: Any) -> Any:
            rep, failed = load(job)
            if not failed:
                self.disk_loaded += sum(n for t, n in zip(job.tiers, job.sizes, strict=True)
                                        if t == "nvme")
            return rep, failed

        side.load = counted

    # ---------------------------------------------------------------- per step
    def after_step(self) -> None:
        """Wait for vLLM's fs tier threads (module docstring; ours-nvme's tier ops are
        waited for by ``run._drive`` after every step of any of ours' runs)."""
        if not self.fs:
            return
        from vllm.v1.kv_offload.tiering.async_lookup import LookupPhase

        lm = self.tier._lookup_manager
        end = time.monotonic() + SETTLE_TIMEOUT_S
        while any(s.phase is LookupPhase.IN_FLIGHT for s in lm._lookup_state.values()):
            if time.monotonic() > end:
                raise TimeoutError("fs tier lookups did not finish")
            time.sleep(0.0002)
            lm.drain_results()
        self.tier.drain_jobs()

    # ---------------------------------------------------------------- bytes
    def host_bytes(self, sched: Any, worker: Any) -> int:
        """Host bytes held now (host tier only)."""
        if self.fs:
            prim = sched.connector.connector_scheduler.manager.primary_tier
            used = prim._num_chunks - prim._get_num_free_chunks()
            return int(used * worker.connector_worker.spec.kv_bytes_per_chunk)
        tiers = worker.worker.worker.executor.tiers.values()
        return int(sum(t.used(k) for t in tiers if not getattr(t, "slow", False)
                       for k in _kinds()))

    def disk_bytes(self, worker: Any) -> int:
        """Disk bytes held now by the disk tier's own accounting (module docstring)."""
        if self.fs:
            return dp.file_bytes(self.root, ".bin")
        tiers = worker.worker.worker.executor.tiers.values()
        return int(sum(t.used(k) for t in tiers if getattr(t, "slow", False) for k in _kinds()))

    def probe(self, worker: Any) -> None:
        """Peak disk bytes (ours evicts; the fs tier never does: its end is its peak)."""
        if not self.fs:
            self.peak = max(self.peak, self.disk_bytes(worker))

    def finish(self, worker: Any) -> dict[str, Any]:
        """The row's disk figures (before the connector shuts down)."""
        held = self.disk_bytes(worker)
        out: dict[str, Any] = {"disk_held_bytes": held, "disk_peak_bytes": max(self.peak, held)}
        if self.fs:
            out["disk_loaded_bytes"] = int(self.copier.disk_loaded_bytes)
            out["disk_read_bytes"] = self.promoted_chunks * int(self.tier._block_size)
        else:
            out["disk_loaded_bytes"] = self.disk_loaded
            slow = [t for t in worker.worker.worker.executor.tiers.values()
                    if getattr(t, "slow", False)]
            out["disk_held_by_kind"] = {k.name.lower(): int(sum(t.used(k) for t in slow))
                                        for k in _kinds()}
        return out

    def close(self) -> dict[str, Any]:
        """Bytes the directory held on disk (after shutdown flushed it); removes it."""
        out = {"disk_file_bytes": dp.file_bytes(self.root) if self.root.exists() else 0}
        shutil.rmtree(self.root, ignore_errors=True)
        yaml_path = Path(str(self.root) + ".yaml")
        yaml_path.unlink(missing_ok=True)
        return out


def _kinds() -> Any:
    from hybrid_connector.core.keys import ObjectKind

    return ObjectKind
