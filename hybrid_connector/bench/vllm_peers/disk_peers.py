"""The head-to-head's host + disk peers (opt-in through ``--peers``): their configurations.

* ``offload-fs``: vLLM's ``OffloadingConnector`` with its ``TieringOffloadingSpec``
  (``spec_name``): the CPU primary tier (``CPUPrimaryTierOffloadingManager``, LRU) of
  ``cpu_bytes_to_use`` = the host budget, and one secondary tier ``{"type": "fs",
  "root_dir": <a new directory under the work directory>}``, vLLM's
  ``FileSystemTierManager`` at its defaults (16 read and 16 write threads, ``O_DIRECT``
  where the filesystem takes it). That tier has no capacity and evicts nothing
  (``tiering/fs/manager.py``: ``submit_store`` writes every chunk the primary tier
  cascades to it in ``TieringOffloadingManager.complete_store``), so its disk budget is
  whatever it ends up holding.
* ``ours-nvme``: ``ours-pooled`` (the shipped config at the benchmark's scale, one host
  pool for KV and states) plus the shipped config's NVMe tier: ``local_disk`` a new
  directory under the work directory, ``disk_fsync`` / ``disk_verify_reads`` as shipped,
  ``max_local_disk_size`` = ``pools.disk.kv_state`` = the disk budget less
  ``HEADER_ALLOWANCE`` (as shipped: one budget KV and states share; no anchor pool, since
  stock vLLM cannot replay anchors). Its disk budget is matched to ``offload-fs``: the bytes
  ``offload-fs``'s fs tier held at the end of the same trace and host budget (its files'
  sizes: one page-aligned chunk each); where ``offload-fs`` did not run, the sweep gives
  the bytes of every block of the trace once (more than either can write). Ours counts
  payload bytes against its budget and each file adds a header (key, metadata, checksums),
  hence the allowance: its files stay within the bytes the peer's files took.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml

#: share of ``ours-nvme``'s disk budget left for its files' headers (module docstring)
HEADER_ALLOWANCE = 0.03


def transfer(name: str, budget: int, *, work: Path, ours: str, shipped: Path,
             disk_budget: int | None, load_gate: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """``name``'s ``KVTransferConfig`` as JSON at ``budget`` host bytes, its disk tier in a
    new directory under ``work`` (``disk_dir`` finds it; the run removes it). ``ours``:
    ``ours-pooled``'s YAML at this budget (``setups.ours_yaml``), ``shipped`` the shipped
    config it came from."""
    root = Path(tempfile.mkdtemp(prefix=f"{name}-{budget}-", dir=work))
    if name == "offload-fs":
        extra: dict[str, Any] = {"spec_name": "TieringOffloadingSpec",
                                 "cpu_bytes_to_use": budget, "eviction_policy": "lru",
                                 "secondary_tiers": [{"type": "fs", "root_dir": str(root)}]}
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": extra}
    if name == "ours-nvme":
        if disk_budget is None or disk_budget <= 0:
            raise ValueError("ours-nvme needs a disk budget (disk_budget > 0)")
        path = Path(f"{root}.yaml")
        path.write_text(nvme_yaml(ours, shipped, root, disk_budget, load_gate))
        return {"kv_connector": "HybridConnector",
                "kv_connector_module_path": "hybrid_connector.integrations.vllm",
                "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"config_file": str(path)}}
    raise ValueError(f"not a disk peer: {name!r}")


def nvme_yaml(ours: str, shipped_path: Path, disk: Path, disk_budget: int,
              load_gate: dict[str, Any] | None = None) -> str:
    """``ours-pooled``'s YAML ``ours`` with the NVMe tier of the shipped config at
    ``shipped_path`` in ``disk`` at ``disk_budget`` bytes (module docstring), and the
    ``load_gate`` block given (``ttft.TTFTModel.load_gate``: loads from disk weighed
    against recomputing at the modeled H200's rates, as a user sets it for their GPU)."""
    cfg = yaml.safe_load(ours)
    if load_gate is not None:
        cfg["load_gate"] = dict(load_gate)
    shipped = yaml.safe_load(shipped_path.read_text())
    payload = int(disk_budget * (1 - HEADER_ALLOWANCE))
    cfg.update({"local_disk": str(disk), "max_local_disk_size": f"{payload}B",
                "disk_fsync": bool(shipped.get("disk_fsync", True)),
                "disk_verify_reads": bool(shipped.get("disk_verify_reads", True))})
    cfg["pools"]["disk"] = {"kv_state": f"{payload}B"}
    return yaml.safe_dump(cfg, sort_keys=False)


def disk_dir(name: str, transfer_cfg: dict[str, Any]) -> Path:
    """The disk tier's directory of a disk peer's ``KVTransferConfig``."""
    extra = transfer_cfg["kv_connector_extra_config"]
    if name == "offload-fs":
        return Path(extra["secondary_tiers"][0]["root_dir"])
    cfg = yaml.safe_load(Path(extra["config_file"]).read_text())
    return Path(cfg["local_disk"])


def file_bytes(root: Path, suffix: str = "") -> int:
    """Bytes of the regular files under ``root`` whose names end with ``suffix``."""
    return sum(p.stat().st_size for p in root.rglob(f"*{suffix}") if p.is_file())
