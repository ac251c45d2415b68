"""The capacity benchmark at small sizes: its accounting adds up (hits + misses =
requests, tokens loaded + recomputed = prompt tokens, every tier's bytes within its budget,
every loaded object verified), the checks fail when broken, the command writes its JSON
and PNG and says where, the config file is the embedded default, and ``compute: real``
runs the tiny transformers model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hybrid_connector import cli
from hybrid_connector.bench.capacity import run_capacity
from hybrid_connector.bench.objects import CorruptLoad, Verifier
from hybrid_connector.bench.runner import AccountingError, PointResult, check
from hybrid_connector.bench.schema import CapacityConfig, WorkloadSpec, load_capacity_config
from hybrid_connector.core.config import ConfigError
from hybrid_connector.tiers.executor import Executor

ROOT = Path(__file__).resolve().parents[2]
SMALL = {
    "ratios": [1.0, 4.0],
    "configurations": ["none", "device-lru", "device+host-ours", "device+host+nvme-lru",
                       "device+host+nvme-ours", "vllm-block"],
    "workloads": [
        {"name": "agentic", "kind": "agentic", "sessions": 3, "turns": 4, "tokens_scale": 0.25},
        {"name": "chat", "kind": "chat", "sessions": 3, "turns": 3, "tokens_scale": 0.25},
    ],
    "peers": False,
}


def small(**over: Any) -> CapacityConfig:
    return CapacityConfig.model_validate({**SMALL, **over})


def identities(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        where = f"{r['workload']}/{r['config']}@{r['ratio']}"
        assert r["hits"] + r["misses"] == r["requests"] > 0, where
        assert r["tokens_loaded"] + r["tokens_recomputed"] == r["prompt_tokens"], where
        assert r["objects_verified"] == sum(r["loaded_objects"].values()), where
        for tier, kinds in r["peak_bytes"].items():
            for kind, n in kinds.items():
                assert n <= r["budgets"][tier][kind], (where, tier, kind)
        if r["config"] != "none":
            cs = r["cache_stats"]
            assert (cs["lookups"], cs["hit_tokens"]) == (r["requests"], r["tokens_loaded"]), where
            assert r["reads_verified"] >= r["objects_verified"], where


def test_the_command_runs_and_its_accounting_adds_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "small.yaml"
    cfg.write_text(json.dumps({"capacity": SMALL}))  # JSON is YAML
    assert cli.main(["bench", "capacity", "--config", str(cfg), "--out", str(tmp_path / "out"),
                     "--work", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    jpath, ppath = tmp_path / "out" / "capacity.json", tmp_path / "out" / "capacity.png"
    assert f"JSON: {jpath.resolve()}" in out and f"PNG:  {ppath.resolve()}" in out
    assert ppath.stat().st_size > 10_000
    doc = json.loads(jpath.read_text())
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * len(SMALL["configurations"])
    identities(rows)
    by = {(r["workload"], r["ratio"], r["config"]): r for r in rows}
    deep = by[("agentic", 4.0, "device+host+nvme-ours")]
    assert deep["hits"] and deep["objects_verified"] > 0
    assert deep["hits_by_tier"].get("nvme", 0) > 0  # NVMe really served hits
    assert by[("agentic", 4.0, "none")]["tokens_loaded"] == 0
    assert "device-only LRU (" in out and "MISSED" not in out  # a comparison, not targets
    assert doc["headline"]["compared"]
    assert any("device pool in CPU memory" in n or "GPU HBM" in n for n in doc["notes"])
    assert list(tmp_path.glob("hc-capacity-*")) == []  # the NVMe files are removed


def test_the_checks_can_fail() -> None:
    good = PointResult("w", "c", 1.0, "modeled", requests=2, hits=1, misses=1, prompt_tokens=10,
                       tokens_loaded=4, tokens_recomputed=6,
                       budgets={"device": {"kv": 10, "state": 10, "anchor": 0}},
                       peak_bytes={"device": {"kv": 10, "state": 3}},
                       loaded_objects={"device": 2}, objects_verified=2)
    check(good)
    for bad in ({"misses": 0}, {"tokens_recomputed": 5}, {"objects_verified": 1},
                {"peak_bytes": {"device": {"kv": 11}}}):
        with pytest.raises(AccountingError):
            check(PointResult(**{**good.__dict__, **bad}))


def _flip(out: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    for t in out:
        if t is not None:
            t.view(-1).view(torch.uint8)[0] ^= 0xFF
    return out


def test_a_corrupted_load_is_caught_by_both_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = small(ratios=[4.0], configurations=["device+host+nvme-ours"], workloads=[SMALL["workloads"][1]])
    real_read = Executor.read
    monkeypatch.setattr(Executor, "read", lambda self, k, h=None: _flip(real_read(self, k, h)))
    with pytest.raises(CorruptLoad, match="different bytes than were saved"):
        run_capacity(cfg, tmp_path, progress=False)
    # with the digest check off, the content check (bytes the tokens give) still catches it
    monkeypatch.setattr(Verifier, "read", lambda self, k, h=None: self._read(k, h))
    with pytest.raises(CorruptLoad, match="wrong bytes"):
        run_capacity(cfg, tmp_path, progress=False)
    assert list(tmp_path.glob("hc-capacity-*")) == []  # cleaned up after a failure too


def test_the_config_file_is_the_embedded_default() -> None:
    assert load_capacity_config(ROOT / "configs" / "capacity-cpu.yaml") == CapacityConfig()
    assert load_capacity_config(None) == CapacityConfig()


def test_bad_configs_name_the_key(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("capacity:\n  ratios: [0]\n")
    with pytest.raises(ConfigError, match="capacity.ratios"):
        load_capacity_config(p)
    p.write_text("capacity:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_capacity_config(p)
    assert cli.main(["bench", "capacity", "--config", str(p)]) == 2


def test_real_compute_runs_the_tiny_model(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    w = WorkloadSpec(name="agentic", kind="agentic", sessions=4, turns=3, tokens_scale=1.0,
                     side_calls=0.0)
    cfg = small(compute="real", ratios=[2.0], workloads=[w], headline_ratio=2.0,
                real={"sessions": 2, "tokens_scale": 0.06},
                configurations=["none", "device-lru", "device+host+nvme-ours"])
    doc = run_capacity(cfg, tmp_path, progress=False)
    identities(doc["rows"])
    assert any("compute: real" in n for n in doc["notes"])
    assert doc["workloads"]["agentic"]["summary"]["sessions"] == 2  # shrunk for the real model
    ours = next(r for r in doc["rows"] if r["config"] == "device+host+nvme-ours")
    assert ours["compute"] == "real" and ours["hits"] > 0 and ours["reads_verified"] > 0
