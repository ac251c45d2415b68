"""``hybrid-connector bench vllm-peers`` on a small trace: every peer runs in vLLM 0.33's real
Scheduler, vLLM decided every hit (the runner's count of each request's computed tokens at
its first schedule equals vLLM's own SchedulerStats), connectors' loads happened and every
byte they restored was checked, every row carries its bytes moved and a modeled TTFT, and
the report and plot are written."""

from __future__ import annotations

import json
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
    for name, r in rows.items():  # bytes moved and stored per hit token, every connector
        assert r["stored_bytes_per_hit_token"] == pytest.approx(r["stored_bytes"] / r["hit_tokens"])
        if name not in ("ours", "ours-pooled"):
            assert (r["loaded_bytes"], r["stored_bytes"]) == (
                r["standin_loaded_bytes"], r["standin_stored_bytes"]), name
    for name in ("ours", "ours-pooled"):  # our own counters, through vLLM's SchedulerStats
        assert rows[name]["loaded_bytes"] > 0 and rows[name]["stored_bytes"] > 0, name
    assert rows["none"]["loaded_bytes"] == rows["none"]["stored_bytes"] == 0
    assert rows["none"]["external_hit_tokens"] == 0
    assert all(0 <= r["external_hit_tokens"] <= r["hit_tokens"] for r in rows.values())
    assert rows["ours"]["external_hit_tokens"] > 0
    m = doc["ttft_model"]
    assert m["peak_bf16_tflops"] > 0 and 0 < m["mfu"] <= 1 and m["load_gbps"]["host"] > 0
    for name, r in rows.items():  # modeled TTFT: its parts add up, loads only with loaded bytes
        t = r["ttft"]
        assert t["mean_ms"] == pytest.approx(t["compute_ms"] + t["load_ms"] + m["overhead_ms"])
        assert t["compute_ms"] > 0 and (t["load_ms"] > 0) == (r["loaded_bytes"] > 0), name
        assert "per_request" not in r
    # the work files keep each request's (prompt, hit, external) tokens
    kept = [json.loads(x) for x in (tmp_path / "rows-multiround_qa.jsonl").read_text().splitlines()]
    for k in kept:
        per = k["per_request"]
        assert len(per) == k["requests"] and sum(h for _, h, _ in per) == k["hit_tokens"]
        assert sum(e for _, _, e in per) == k["external_hit_tokens"]
    host = [rows[n]["ttft_vs_best_vllm"] for n in rep.HOST_PEERS]
    assert min(host) == pytest.approx(1.0) and all(x >= 1.0 for x in host)
    assert rows["none"]["ttft_vs_best_vllm"] is None
    assert rows["ours"]["ttft_vs_best_vllm"] == pytest.approx(
        rows["ours"]["ttft"]["mean_ms"] / min(rows[n]["ttft"]["mean_ms"] for n in rep.HOST_PEERS))
    c = doc["traces"]["multiround_qa"]["ceiling"]  # no connector beats the unlimited cache
    assert all(r["hit_rate"] <= c["hit_rate"] + 1e-9 for r in rows.values())
    assert all(r["ttft"]["mean_ms"] >= c["ttft_ms"] - 1e-9 for r in rows.values())
    assert "HybridConnector (ours)" in rep.markdown(doc)
    out = rep.text(doc)
    assert "HybridConnector (ours)" in out and "MET" not in out
    assert all(c in out for c in ("held/hit", "wrtn/hit", "TTFT ms", "vs best", "TFLOP/s", "GB/s", "best possible"))
    assert rep.plot(tmp_path / "p.png", doc) is None and (tmp_path / "p.png").stat().st_size > 0


def test_under_async_scheduling_every_hit_is_vllms_and_checked_and_answers_are_reused(
        tmp_path: Path) -> None:
    """``--async-scheduling``: vLLM's ``AsyncScheduler`` (its default on a GPU) with two
    steps in flight, each request ending at its answer's last token as a stop token (as a
    chat template's end-of-turn token), so the step in flight computes that token when
    vLLM calls ``request_finished``. Hits stay vLLM's and byte-checked, and ours still
    serves stored answers: before, its end-of-request state was dropped whenever a step was
    in flight, and the chat turns hit no deeper than the peers' block-floored prefixes."""
    cfg = vp.PeersConfig(traces={"chat_edits": (16, 4)}, multiples=(2.0,), concurrency=2,
                         peers=("none", "offload-lru", "ours-pooled"), async_scheduling=True)
    doc = vp.run_sweep(cfg, progress=False, work=tmp_path, configs=ROOT / "configs")
    rows = {r["peer"]: r for r in doc["rows"]}
    for name, r in rows.items():
        assert r["hit_tokens"] == r["vllm_hits"], name
        assert r["checked_tokens"] == r["hit_tokens"], name
    ours = rows["ours-pooled"]
    assert ours["ours"]["failed_loads"] == 0 and ours["ours"]["hits_without_state"] == 0
    assert ours["hit_rate"] > rows["offload-lru"]["hit_rate"] > rows["none"]["hit_rate"]
    assert "AsyncScheduler" in rep.text(doc)


def test_a_sweep_without_a_work_directory_leaves_nothing_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``work`` the sweep writes its model config and rows to a temporary
    directory of its own and removes it when done. Before, every ``bench vllm-peers``
    run (and ``benchmarks/vllm_lru_refresh.py``, twice per run) left one in ``/tmp``."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = vp.PeersConfig(traces={"multiround_qa": (4, 2)}, multiples=(1.0,), concurrency=1,
                         peers=("none",))
    doc = vp.run_sweep(cfg, progress=False, configs=ROOT / "configs")
    assert [r["peer"] for r in doc["rows"]] == ["none"]
    assert list(tmp_path.iterdir()) == []


def test_gpu_step_ms_idles_the_engine_thread_after_each_step(tmp_path: Path) -> None:
    """``--gpu-step-ms``: after each step the engine thread sleeps as vLLM's engine core
    waits on a GPU's forward pass (a CPU run has none), so a connector's own threads (ours:
    the bounded auto-alpha tuner) get that time; the report says so, and rows of ours carry
    how many requests the tuner skipped (None until the host first evicts)."""
    cfg = vp.PeersConfig(traces={"multiround_qa": (6, 3)}, multiples=(0.25,), concurrency=1,
                         peers=("ours-shipped",), gpu_step_ms=20.0)
    doc = vp.run_sweep(cfg, progress=False, work=tmp_path, configs=ROOT / "configs")
    (row,) = doc["rows"]
    assert row["wall_s"] >= row["steps"] * 0.020
    assert row["sched_wall_ms_mean"] > 0 and row["sched_wall_ms_p99"] >= row["sched_wall_ms_mean"]
    assert row["checked_tokens"] == row["hit_tokens"] == row["vllm_hits"]
    assert isinstance(row["tuner_skipped"], int)  # 0.25x evicts: the tuner ran
    assert "idles 20 ms after each step" in rep.text(doc)


def test_a_negative_gpu_step_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from hybrid_connector.cli.entry import main

    assert main(["bench", "vllm-peers", "--gpu-step-ms", "-1", "--quick"]) == 2
    assert "--gpu-step-ms must be >= 0" in capsys.readouterr().err
