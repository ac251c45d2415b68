"""``hybrid-connector bench vllm-peers`` on a small trace: every peer runs in vLLM 0.33's real
Scheduler, vLLM decided every hit (the runner's count of each request's computed tokens at
its first schedule equals vLLM's own SchedulerStats), connectors' loads happened and every
byte they restored was checked, and the report and plot are written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from hybrid_connector.bench.vllm_peers import report as rep  # noqa: E402
from hybrid_connector.bench.vllm_peers import sweep as vp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_every_peer_runs_in_vllms_scheduler_and_its_hits_are_vllms_and_checked(tmp_path: Path) -> None:
    cfg = vp.PeersConfig(traces={"multiround_qa": (12, 3)}, multiples=(1.0,), concurrency=1,
                         device_share=0.0)
    doc = vp.run_sweep(cfg, progress=False, work=tmp_path, configs=ROOT / "configs")
    rows = {r["peer"]: r for r in doc["rows"]}
    assert set(rows) == set(vp.st.PEERS)
    for name, r in rows.items():
        assert r["hit_tokens"] == r["vllm_hits"], name      # vLLM's own stats agree
        assert r["checked_tokens"] == r["hit_tokens"], name  # every hit's bytes checked
        assert 0 < r["hit_rate"] < 1
    none = rows["none"]
    for name in ("offload-lru", "offload-arc", "simple"):
        assert rows[name]["standin_stored_bytes"] > 0, name  # the CPU copy ran
        assert rows[name]["hit_tokens"] >= none["hit_tokens"], name
    assert any(rows[n]["standin_loaded_bytes"] > 0 for n in ("offload-lru", "simple"))
    for name in ("ours", "ours-pooled"):  # split KV/state pools, one pooled budget
        ours = rows[name]["ours"]
        assert ours["failed_loads"] == 0 and ours["hits_without_state"] == 0, name
        assert ours["loaded_tokens"] > 0, name
        assert rows[name]["hit_tokens"] > none["hit_tokens"], name
    assert "HybridConnector (ours)" in rep.markdown(doc)
    out = rep.text(doc)
    assert "HybridConnector (ours)" in out and "MET" not in out
    assert rep.plot(tmp_path / "p.png", doc) is None and (tmp_path / "p.png").stat().st_size > 0
