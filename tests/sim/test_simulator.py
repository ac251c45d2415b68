"""The replay loop through the real cache, metrics, baselines and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybrid_connector.cli import main
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.runtime.simulator import Simulator, anchor_page_bytes
from hybrid_connector.sim.baselines import baseline_specs, vllm_align_block
from hybrid_connector.sim.prefill import PrefillModel
from hybrid_connector.sim.simulate import run_once, run_spec
from hybrid_connector.sim.traces import agentic, multi_turn_chat, save_jsonl
from hybrid_connector.tiers.size_only import Budget


def test_step_semantics(geo, sim_config) -> None:
    sim = Simulator(sim_config, geo, Budget.pooled(10**13), eviction=MarconiEviction(alpha=0.0))
    rng = np.random.default_rng(0)
    a, out = rng.integers(3, 9000, size=1000), rng.integers(3, 9000, size=100)
    first = sim.step(a, out)
    assert first.hit == 0 and first.states_saved == 1
    nxt = np.concatenate([a, out, rng.integers(3, 9000, size=50)])
    second = sim.step(nxt, out)
    assert second.hit == 1100 and second.exact  # the final state of turn 1
    assert second.loaded_bytes == 1100 * geo.kv_bytes_per_token() + geo.state_bytes()
    # A branch: shares 600 tokens with a; Marconi admission checkpoints the branch point.
    br = np.concatenate([a[:600], rng.integers(9000, 9999, size=300)])
    third = sim.step(br, out)
    assert third.hit == 0 and third.states_saved == 2
    again = np.concatenate([a[:600], rng.integers(9000, 9999, size=10)])
    assert sim.step(again, out).hit == 600
    sim.cache.check_integrity()
    used = sim.store.used(ObjectKind.KV)
    assert used == sim.cache.tree.bytes[ObjectKind.KV]


def test_anchor_pages_give_approximate_hits(geo) -> None:
    from hybrid_connector.core.config import load_config

    cfg = load_config(None, {"chunk_size": 256, "hash_block_size": 256, "alignment": 1,
                             "replay": True}, environ={})
    sim = Simulator(cfg, geo, Budget.pooled(10**13, 10**12), eviction=MarconiEviction(alpha=0.0),
                    anchors=True)
    rng = np.random.default_rng(1)
    a = rng.integers(3, 9000, size=2000)
    sim.step(a, np.array([5]))
    b = np.concatenate([a[:1500], rng.integers(9000, 9999, size=20)])
    res = sim.step(b, np.array([5]))
    assert not res.exact and res.hit == 1472  # the last full 64-token page before 1500
    # 16 positions by density, but groups of 6 Mamba2 layers (kernel 4) need 3 * 6 = 18
    assert anchor_page_bytes(geo, 64, 0.25) == 18 * geo.anchor_bytes_per_token()


def test_prefill_model_is_monotone(geo) -> None:
    m = PrefillModel()
    t = [m.ttft(geo, 8000, hit) for hit in (0, 2000, 4000, 7999)]
    assert t == sorted(t, reverse=True)
    assert m.ttft(geo, 8000, 0) == pytest.approx(
        m.overhead_s + geo.flops_saved(8000).total / (m.peak_flops * m.mfu))


def test_vllm_align_block_matches_vllm_for_qwen35() -> None:
    from hybrid_connector.geometry.presets import get_preset

    assert vllm_align_block(get_preset("qwen3.5-4b")) == 528


def test_baselines_run_and_order_on_a_branchy_agentic_trace(geo) -> None:
    recs = agentic(3, 8, 0, sessions_per_second=1.0, side_calls=1.0, as_arrays=True)
    specs = {s.name: s for s in baseline_specs(geo, grid=(0.0, 1.0))}
    size = int(1.5e9)
    res = {n: run_spec(recs, specs[n], geo, size) for n in ("vllm_block", "sglang", "oracle")}
    assert res["sglang"].token_hit_rate > 2 * res["vllm_block"].token_hit_rate
    fixed = [run_once(recs, specs["oracle"], geo, size, alpha=a).flops_saved for a in (0.0, 1.0)]
    assert res["oracle"].flops_saved == max(fixed)
    for r in res.values():
        assert 0 <= r.token_hit_rate <= 1 and r.requests == len(recs)
        assert r.ttft_p95 >= r.ttft_p50 > 0


def test_cli_gen_trace_and_simulate(tmp_path, capsys) -> None:
    trace = tmp_path / "chat.jsonl"
    assert main(["gen-trace", "chat", "--out", str(trace), "--sessions", "4", "--turns", "3"]) == 0
    cfg = tmp_path / "c.yaml"
    cfg.write_text("eviction: marconi\nalpha: 0.5\n")
    out = tmp_path / "rows.json"
    assert main(["simulate", "--trace", str(trace), "--config", str(cfg), "--size", "2GiB",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows[0]["policy"] == "configured" and rows[0]["alpha"] == 0.5
    assert "tok_hit" in capsys.readouterr().out
    assert main(["simulate", "--trace", str(tmp_path / "missing.jsonl")]) == 2


def test_demo_generator_signature_still_works() -> None:
    recs = multi_turn_chat(3, 2, 0)
    assert len(recs) == 6 and isinstance(recs[0]["input_tokens"], list)
    save_jsonl(recs, "/dev/null")


def test_anchor_pressure_never_evicts_kv(geo) -> None:
    from hybrid_connector.core.config import load_config

    cfg = load_config(None, {"chunk_size": 256, "hash_block_size": 256, "alignment": 1,
                             "replay": True}, environ={})
    page_bytes = anchor_page_bytes(geo, 64, cfg.anchor_density)
    pol = MarconiEviction(alpha=1.0)
    sim = Simulator(cfg, geo, Budget.pooled(10**13, 40 * page_bytes), eviction=pol, anchors=True)
    rng = np.random.default_rng(3)
    seqs = [rng.integers(3, 9000, size=1500) for _ in range(4)]
    for s in seqs:
        sim.step(s, np.array([5]))
    st = sim.cache.stats
    assert st.evicted["anchor"] > 0 and st.evicted["kv"] == 0 and st.evicted["state"] == 0
    assert sim.store.used(ObjectKind.ANCHOR) <= 40 * page_bytes
    # The newest sequence kept its anchors (least recently used anchors went first).
    last = sim.cache.tree.match(seqs[-1]).path
    assert any(n.anchors for n in last)
    sim.cache.check_integrity()


# ---------------------------------------------------------------- issue 9, item 21
def _trace(tmp_path):
    trace = tmp_path / "chat.jsonl"
    save_jsonl(multi_turn_chat(3, 3, 0, lengths="sharegpt", as_arrays=True), trace)
    return trace


def _simulate(tmp_path, *extra):
    out = tmp_path / "rows.json"
    rc = main(["simulate", "--trace", str(_trace(tmp_path)), "--json", str(out), *extra])
    return rc, (json.loads(out.read_text()) if rc == 0 else None)


def test_simulate_accepts_a_geometry_yaml_as_model(tmp_path, geo, capsys) -> None:
    import yaml

    gfile = tmp_path / "geo.yaml"
    gfile.write_text(yaml.safe_dump({**geo.to_dict(), "name": "my-geometry"}))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {gfile}\n")
    rc, rows = _simulate(tmp_path, "--config", str(cfg), "--size", "2GiB")
    assert rc == 0 and rows[0]["policy"] == "configured"
    assert "model my-geometry" in capsys.readouterr().out
    rc, _ = _simulate(tmp_path, "--model", str(gfile), "--size", "2GiB")
    assert rc == 0
    assert _simulate(tmp_path, "--model", str(tmp_path / "missing.yaml"))[0] == 2


def test_stored_bytes_are_bytes_and_counts_are_counts(geo) -> None:
    recs = multi_turn_chat(3, 3, 0, lengths="sharegpt", as_arrays=True)
    spec = next(s for s in baseline_specs(geo, grid=(0.0,)) if s.name == "sglang")
    r = run_once(recs, spec, geo, int(2e9))
    assert r.stored_objects["state"] > 0 and r.stored_objects["kv"] > 0
    assert r.stored_bytes["state"] == r.stored_objects["state"] * geo.state_bytes()
    kv_tok = geo.kv_bytes_per_token()
    assert r.stored_bytes["kv"] % kv_tok == 0
    assert r.stored_bytes["kv"] // kv_tok >= r.stored_objects["kv"]  # >= 1 token per chunk
    assert r.row()["stored_bytes"] == r.stored_bytes


def test_size_defaults_to_the_config_pool_budgets(tmp_path, capsys) -> None:
    cfg = tmp_path / "c.yaml"
    # No state pool at all: nothing can hit unless --size pools KV and states together.
    cfg.write_text("eviction: marconi\nalpha: 0.5\npools:\n  host:\n    kv: 2GiB\n    state: 0\n")
    rc, rows = _simulate(tmp_path, "--config", str(cfg))
    out = capsys.readouterr().out
    assert rc == 0 and rows[0]["budget_bytes"] == 2 * 2**30
    assert rows[0]["stored_objects"]["state"] == 0 and rows[0]["hit_tokens"] == 0
    assert "config" in out and "--size" not in out
    rc, rows = _simulate(tmp_path, "--config", str(cfg), "--size", "2GiB")
    out = capsys.readouterr().out
    assert rc == 0 and rows[0]["budget_bytes"] == 2 * 2**30
    assert rows[0]["stored_objects"]["state"] > 0 and rows[0]["hit_tokens"] > 0
    assert "--size 2GiB overrides" in out
    empty = tmp_path / "empty.yaml"
    empty.write_text("local_cpu: false\n")
    assert _simulate(tmp_path, "--config", str(empty))[0] == 2
    assert "--size" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["cpu-demo.yaml", "vllm.yaml"])
def test_simulate_runs_the_example_configs(tmp_path, name) -> None:
    from pathlib import Path

    from hybrid_connector.core.config import load_config

    path = Path(__file__).resolve().parents[2] / "configs" / name
    rc, rows = _simulate(tmp_path, "--config", str(path), "--size", "1GiB")
    assert rc == 0 and rows[0]["policy"] == "configured"
    # The configured spec re-validates the file's keys to the same values (GB keys too).
    cfg = load_config(path, environ={})
    assert load_config(None, cfg.explicit(), environ={}) == cfg


# ---------------------------------------------------------------- issue 9, item 22
def test_simulator_paths_close_every_cache_they_build(geo, sim_config, monkeypatch) -> None:
    from hybrid_connector.policies.admission.checkpoints import MarconiAdmission
    from hybrid_connector.policies.eviction.accounting import CorrectedAccounting
    from hybrid_connector.policies.tuning.grid import TunerRequest
    from hybrid_connector.runtime.cache import HybridCache
    from hybrid_connector.runtime.tuner_caches import CacheReplayer

    built, closed = [], []
    init, close = HybridCache.__init__, HybridCache.close

    def counting_init(self, *a, **k):
        built.append(self)
        init(self, *a, **k)

    def counting_close(self):
        closed.append(self)
        close(self)

    monkeypatch.setattr(HybridCache, "__init__", counting_init)
    monkeypatch.setattr(HybridCache, "close", counting_close)
    recs = multi_turn_chat(2, 2, 0, as_arrays=True)
    spec = next(s for s in baseline_specs(geo, grid=(0.0, 1.0)) if s.name == "oracle")
    run_spec(recs, spec, geo, int(2e9))  # one cache per grid point
    window = [TunerRequest(np.concatenate([r["input_tokens"], r["output_tokens"]]),
                           len(r["input_tokens"])) for r in recs]
    CacheReplayer(sim_config, geo, Budget.pooled(int(2e9)), MarconiAdmission,
                  CorrectedAccounting)(window, 0.5, 0)
    assert len(built) == 3 and {id(c) for c in closed} == {id(c) for c in built}
    with Simulator(sim_config, geo, Budget.pooled(int(2e9))) as sim:
        sim.step(window[0].tokens, np.array([5]))
    assert closed[-1] is sim.cache


def test_an_anchor_density_of_0_simulates_with_one_position_per_page() -> None:
    """``anchor_density: 0`` is a valid config (one anchor position per page, as the index
    prices it); the simulator used to pass the raw 0 to the size rule and refuse to start."""
    from hybrid_connector.core.config import load_config
    from hybrid_connector.geometry.anchors import anchor_block_bytes
    from hybrid_connector.geometry.presets import load_geometry

    geo = load_geometry("qwen3.5-4b")
    cfg = load_config(None, {"chunk_size": 256, "hash_block_size": 256, "alignment": 1,
                             "anchor_density": 0.0}, environ={})
    with Simulator(cfg, geo, Budget.pooled(10**15, anchor=10**15), anchors=True) as sim:
        assert sim.anchor_bytes == anchor_block_bytes(geo, cfg.anchor_page_size, 1 / cfg.anchor_page_size)
        sim.step(np.arange(1024, dtype=np.int64), np.arange(8, dtype=np.int64))
        assert sim.store.put_bytes[ObjectKind.ANCHOR] > 0
