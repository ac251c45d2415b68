"""The head-to-head's modeled TTFT (``bench.vllm_peers.ttft``) on constructed rows: the
unscaled model's FLOPs at the stated throughput, the run's loaded bytes scaled back up and
shared by external hit tokens, the ratio to the best of vLLM's connectors per trace and
budget, and the constants the project states elsewhere."""

from __future__ import annotations

import pytest

from hybrid_connector.bench.vllm_peers import ttft
from hybrid_connector.core.config_types import TierReadRates
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.sim.prefill import PrefillModel


def test_the_constants_are_the_projects_stated_h200_figures() -> None:
    p, rates = PrefillModel(), TierReadRates()
    assert (p.peak_flops, p.mfu, p.overhead_s) == (ttft.PEAK_BF16_FLOPS, ttft.MFU, ttft.OVERHEAD_S)
    assert {"host": rates.host, "nvme": rates.disk} == ttft.LOAD_GBPS
    m = ttft.for_preset("qwen3.5-4b", 16.5)
    assert m.geometry.name == get_preset("qwen3.5-4b").name  # the unscaled model's FLOPs
    # real KV bytes of 16.5 tokens (8 layers x 4,096 B, bf16) over one scaled token's (256 B)
    assert m.byte_factor == pytest.approx(16.5 * 32768 / 256)
    c = m.constants()
    assert c["token_factor"] == 16.5 and set(c["sources"]) == {"peak_bf16_flops", "mfu",
                                                               "overhead_s", "load_gbps"}


def test_compute_is_the_unscaled_models_flops_of_the_tokens_left_at_the_stated_rate() -> None:
    m = ttft.for_preset("qwen3.5-4b", 16.5)
    geo = get_preset("qwen3.5-4b")
    # 100 scaled prompt tokens, 40 hit: tokens [660, 1650) of the real model
    want = geo.flops_saved(990, 660).total / (989e12 * 0.45)
    assert m.compute_s(100, 40) == pytest.approx(want)
    assert m.compute_s(100, 100) == 0.0
    assert m.compute_s(100, 0) > m.compute_s(100, 40) > m.compute_s(100, 80)


def test_loads_are_scaled_back_up_and_shared_by_external_hit_tokens() -> None:
    m = ttft.TTFTModel(get_preset("qwen3.5-4b"), 16.5, byte_factor=1000.0, overhead_s=0.0)
    detail = [(100, 40, 30), (100, 0, 0), (50, 40, 10)]  # (prompt, hit, external hit)
    parts = m.requests(detail, loaded_bytes=4e6)  # 4 MB over 40 external tokens
    loads = [x for _, x in parts]
    assert loads[0] == pytest.approx(3e6 * 1000 / 25e9) and loads[1] == 0.0
    assert loads[2] == pytest.approx(1e6 * 1000 / 25e9)
    assert m.load_s(1e6, "nvme") == pytest.approx(1e6 * 1000 / 6e9)
    s = m.summary(detail, 4e6)
    total = [(c + x) * 1e3 for c, x in parts]
    assert s["mean_ms"] == pytest.approx(sum(total) / 3)
    assert s["load_ms"] == pytest.approx(sum(loads) * 1e3 / 3)
    assert s["p50_ms"] == pytest.approx(sorted(total)[1])
    # a hit with no external part (vLLM's own prefix cache) loads nothing
    assert m.summary([(100, 40, 0)], 0.0)["load_ms"] == 0.0


def test_the_ratio_is_to_the_lowest_vllm_connector_of_the_same_trace_and_budget() -> None:
    def row(peer: str, trace: str, mult: float | None, ms: float) -> dict[str, object]:
        return {"peer": peer, "trace": trace, "multiple": mult, "ttft": {"mean_ms": ms}}

    rows = [row("none", "a", None, 90.0), row("offload-lru", "a", 1.0, 40.0),
            row("simple", "a", 1.0, 50.0), row("ours", "a", 1.0, 20.0),
            row("offload-lru", "a", 2.0, 30.0), row("ours", "a", 2.0, 33.0),
            row("ours", "b", 1.0, 10.0)]
    ttft.best_vllm_ratios(rows, ("offload-lru", "offload-arc", "simple"))
    got = [r["ttft_vs_best_vllm"] for r in rows]
    assert got == [None, 1.0, 1.25, 0.5, 1.0, pytest.approx(1.1), None]


def test_loads_no_request_counted_as_a_hit_are_shared_evenly() -> None:
    m = ttft.TTFTModel(get_preset("qwen3.5-4b"), 16.5, byte_factor=1.0, overhead_s=0.0)
    loads = [x for _, x in m.requests([(10, 0, 0), (10, 0, 0)], loaded_bytes=50e9)]
    assert loads == [pytest.approx(1.0), pytest.approx(1.0)]  # 25 GB each at 25 GB/s


def test_the_report_compares_rows_merged_from_separate_runs() -> None:
    from hybrid_connector.bench.vllm_peers import report as rep

    def row(peer: str, mult: float | None, ms: float) -> dict[str, object]:
        return {"peer": peer, "trace": "a", "multiple": mult, "budget": 1e6, "ttft": {"mean_ms": ms},
                "hit_rate": 0.5, "recomputed": 10, "bytes_per_hit_token": 3.0,
                "stored_bytes_per_hit_token": 4.0, "sched_ms_mean": 1.0, "sched_ms_p99": 2.0}

    # the pooled row came from its own run (no vLLM connector beside it: no ratio yet)
    rows = [row("none", None, 30.0), row("offload-lru", 1.0, 20.0), row("simple", 1.0, 25.0),
            dict(row("ours-pooled", 1.0, 15.0), ttft_vs_best_vllm=None)]
    doc = {"geometry": {"preset": "qwen3.5-4b", "divisor": 16.5, "block": 32, "real_block": 528,
                        "kv_bytes_per_token": 256, "state_bytes": 24192},
           "vllm": "0.33.0", "config": {"concurrency": 1},
           "traces": {"a": {"requests": 2, "prompt_tokens": 20, "working_set_bytes": 1e6,
                            "device_blocks": 8, "device_bytes": 1e6}}, "rows": rows,
           "ttft_model": ttft.for_preset("qwen3.5-4b", 16.5).constants()}
    out = rep.text(doc)
    assert rows[3]["ttft_vs_best_vllm"] == pytest.approx(0.75)
    assert "0.75" in out and "+ 10 ms per request" in out and "x128" in out
