"""Data-parallel vLLM engines on one node (``--data-parallel-size 2``): each engine has its
own scheduler, index and workers, so each worker gets its own NVMe directory
(``<local_disk>/dp<d>/rank<r>``) instead of locking the other engine's rank out of a shared
one; each engine saves into, and after a restart adopts from, its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402


def _engines(model: Path, yaml: Path) -> list[tuple[Any, h.Runner]]:
    """Both engines of a two-way data-parallel deployment: (scheduler, runner) each."""
    out = []
    for dp in (0, 1):
        vc = s.vllm_config(model, yaml)
        vc.parallel_config.data_parallel_size = 2
        vc.parallel_config.data_parallel_rank = dp
        cfg = s.kv_cache_config(vc, num_blocks=7)
        worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg)
        out.append((h.make_scheduler(vc, cfg), h.Runner(cfg, worker)))
    return out


def test_data_parallel_engines_keep_their_own_nvme_directories(tmp_path: Path) -> None:
    yaml = tmp_path / "nvme.yaml"
    yaml.write_text(s.BASE_YAML.split("pools:")[0] + s.DISK_YAML.format(dir=tmp_path / "nvme"))
    model = s.tiny_nemotron_h(tmp_path)
    prompts = {dp: list(range(3 + dp, 150 + dp)) for dp in (0, 1)}
    for dp, (sched, runner) in enumerate(_engines(model, yaml)):
        h.run(sched, runner, [h.make_request(f"p{dp}", prompts[dp], 2)])
        runner.connector.shutdown()
        sched.connector.shutdown()
        assert runner.bad == [] and sched.connector.sched.stats.saved_objects["state"] > 0
    dirs = sorted(str(p.relative_to(tmp_path / "nvme")) for p in (tmp_path / "nvme").glob("*/*"))
    assert dirs == ["dp0/rank0", "dp1/rank0"]
    for dp, (sched, runner) in enumerate(_engines(model, yaml)):  # both restart, warm
        warm = h.make_request("warm", list(range(40)), 2)  # its first step carries the inventory
        h.run(sched, runner, [warm, h.make_request("again", prompts[dp], 2)])
        runner.connector.shutdown()
        st = sched.connector.sched.stats
        assert runner.bad == [] and st.restored.get("state", 0) > 0 and st.hits >= 1
