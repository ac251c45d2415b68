"""The head-to-head's opt-in host + disk peers (``bench.vllm_peers.disk_peers``): vLLM's
OffloadingConnector with its TieringOffloadingSpec and fs tier, and ours with its NVMe
tier, on a small trace in vLLM 0.33's real Scheduler: every hit is vLLM's and byte-checked,
both served bytes from disk (modeled at the NVMe rate), ours got the disk bytes vLLM's fs
tier held, and their directories and vLLM's shared region are gone afterwards. The TTFT
model's disk term is checked on constructed numbers (no vLLM needed)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from hybrid_connector.bench.vllm_peers import ttft
from hybrid_connector.geometry.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]


def test_bytes_a_disk_served_add_their_read_at_the_nvme_rate() -> None:
    m = ttft.TTFTModel(get_preset("qwen3.5-4b"), 16.5, byte_factor=1000.0, overhead_s=0.0)
    detail = [(100, 50, 30), (100, 10, 10)]
    host_only = m.requests(detail, 4e6)
    both = m.requests(detail, 4e6, disk_bytes=2e6)
    for (c0, l0), (c1, l1), w in zip(host_only, both, (0.75, 0.25), strict=True):
        assert c0 == c1  # compute unchanged
        assert l1 == pytest.approx(l0 + 2e6 * w * 1000.0 / (ttft.LOAD_GBPS["nvme"] * 1e9))
    s = m.summary(detail, 4e6, disk_bytes=2e6)
    assert s["load_ms"] == pytest.approx(1e3 * (4e9 / 25e9 + 2e9 / 6e9) / 2)


def test_the_disk_peers_run_in_vllms_scheduler_with_checked_hits_and_disk_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # the load gate refuses every disk load of a trace this short (its states add too few
    # tokens to beat recomputing them at full size; tests/vllm/test_vllm_load_gate.py):
    # off here, so that ours' disk path serves bytes
    monkeypatch.setattr(ttft.TTFTModel, "load_gate", lambda self: {"enabled": False})
    from hybrid_connector.bench.vllm_peers import report as rep
    from hybrid_connector.bench.vllm_peers import sweep as vp

    assert not set(vp.st.DISK_PEERS) & set(vp.PeersConfig().peers)  # opt-in only
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    cfg = vp.PeersConfig(traces={"chat_edits": (16, 4)}, multiples=(0.25,), concurrency=2,
                         peers=("ours-nvme", "offload-fs"))  # ours-nvme still runs second
    doc = vp.run_sweep(cfg, progress=False, work=tmp_path, configs=ROOT / "configs")
    rows = {r["peer"]: r for r in doc["rows"]}
    assert set(rows) == {"offload-fs", "ours-nvme"}
    fs, ours = rows["offload-fs"], rows["ours-nvme"]
    for name, r in rows.items():
        assert r["hit_tokens"] == r["vllm_hits"], name       # vLLM's own stats agree
        assert r["checked_tokens"] == r["hit_tokens"], name  # every hit's bytes checked
        assert r["disk_loaded_bytes"] > 0, name              # a disk tier served some
        assert r["disk_peak_bytes"] > 0 and r["peak_bytes"] <= r["budget"] * 1.01, name
    # vLLM's fs tier: promotions read its files back; what it loaded from them was copied
    assert fs["disk_read_bytes"] > 0 and fs["standin_loaded_bytes"] >= fs["disk_loaded_bytes"]
    assert fs["disk_held_bytes"] == fs["disk_peak_bytes"]  # it never evicts
    # ours: the disk budget is what vLLM's fs tier held, and it stayed inside it
    assert ours["disk_budget"] == fs["disk_peak_bytes"]
    assert ours["disk_budget_from"] == "offload-fs"
    assert ours["disk_peak_bytes"] <= ours["disk_budget"]
    assert ours["ours"]["failed_loads"] == 0 and ours["ours"]["hits_without_state"] == 0
    m = ttft.for_preset(doc["config"]["preset"], doc["geometry"]["divisor"])
    for name, r in rows.items():  # the disk's bytes are modeled at the NVMe rate
        n = r["requests"]
        want = (m.load_s(r["loaded_bytes"]) + m.load_s(r["disk_loaded_bytes"], "nvme")) / n
        assert r["ttft"]["load_ms"] == pytest.approx(want * 1e3), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("offload-fs-", "ours-nvme-"))]
    if shm:  # the run removed its shared memory (files other live processes map are theirs)
        new = {f for f in os.listdir("/dev/shm") if f.startswith("vllm_offload_")} - shm
        assert not new - _mapped_by_others(new)
    out = rep.text(doc)
    assert "Disk tiers" in out and "fs tier" in out


def test_ours_nvme_weighs_disk_loads_at_the_modeled_rates(tmp_path: Path) -> None:
    """The ``load_gate`` block the head-to-head gives ours-nvme prices a scaled prefill as
    the TTFT model does (its FLOPs within 0.1%) and its loads at the model's bytes."""
    import yaml

    from hybrid_connector.bench.vllm_peers import disk_peers
    from hybrid_connector.core.config import HybridConfig

    m = ttft.for_preset("qwen3.5-4b", 16.5)
    gate = HybridConfig.model_validate({"load_gate": m.load_gate()}).load_gate
    assert gate.enabled and gate.byte_scale == m.byte_factor
    assert gate.flops_per_token is not None
    rate = m.peak_flops * m.mfu
    for prompt, hit in ((64, 0), (200, 150), (900, 32)):
        flops = sum(gate.flops_per_token + gate.flops_per_position * i
                    for i in range(hit, prompt))
        assert flops / rate == pytest.approx(m.compute_s(prompt, hit), rel=1e-3)
    ours = yaml.safe_dump({"pools": {"host": {"kv_state": "1MB"}}})
    text = disk_peers.nvme_yaml(ours, ROOT / "configs" / "vllm-qwen3_5.yaml", tmp_path, 1 << 20,
                                m.load_gate())
    cfg = yaml.safe_load(text)
    assert cfg["load_gate"] == m.load_gate()
    # one disk budget KV and states share, as shipped; headers fit in what is left
    assert list(cfg["pools"]["disk"]) == ["kv_state"]
    assert cfg["pools"]["disk"]["kv_state"] == cfg["max_local_disk_size"]
    assert int(cfg["max_local_disk_size"][:-1]) == int((1 << 20) * (1 - disk_peers.HEADER_ALLOWANCE))


def _mapped_by_others(names: set[str]) -> set[str]:
    """Those of ``names`` (files in /dev/shm) another live process maps: another vLLM run
    on a busy machine (a benchmark next to the suite), not a leak of this one."""
    import psutil

    out: set[str] = set()
    for proc in psutil.process_iter():
        if names and proc.pid != os.getpid():
            with contextlib.suppress(psutil.Error, OSError):
                out |= {n for m in proc.memory_maps(grouped=False) for n in names
                        if m.path.endswith("/" + n)}
    return out
