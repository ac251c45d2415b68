"""Modeled time to first token (TTFT) of the head-to-head, on stated H200 figures.

The runs execute a scaled model on CPU, so their wall times say nothing about a GPU. What
they do say exactly is, per request at its first schedule, how many prompt tokens vLLM's
scheduler still had to compute and how many it took from the connector (its
``PrefillStats``), and how many bytes the connector moved. The model turns those into
seconds on an H200 serving the unscaled model:

* **compute**: the FLOPs of the unscaled preset (``ModelGeometry.flops_saved`` through
  ``sim.prefill.PrefillModel``: every layer over the tokens ``[hit, prompt)``, attention over
  each token's causal context) with token counts and positions multiplied back by the
  geometry's ``divisor`` (16.5 for Qwen3.5-4B: the scaled block of 32 tokens is the real
  528), at :data:`PEAK_BF16_FLOPS` x :data:`MFU`;
* **loads**: the connector's loaded bytes of the run, scaled back up by the KV byte ratio
  (real KV bytes of ``divisor`` tokens over the scaled KV bytes of one: 2,112 for
  Qwen3.5-4B; a state checkpoint's own ratio is within 1% of it), at :data:`LOAD_GBPS` of
  the tier they came from: every loaded byte crosses from pinned host memory at the
  host rate, and a byte a disk tier served (the opt-in disk peers: vLLM's fs tier promoted
  it into its CPU tier, or ours planned it from its NVMe tier) was first read from disk at
  the ``nvme`` rate (both stage disk reads in host memory; the two hops are added, not
  overlapped). A run's loaded bytes are shared among its requests in proportion to their
  external hit tokens, so the mean load time is exact and the per-request split an
  approximation;
* plus a fixed :data:`OVERHEAD_S` per request (scheduling, launches, the first token).

Compute and loads are added (no overlap of a layer-wise load with the suffix's prefill), and
a request's queueing behind others is not modeled: the figure compares what each connector
leaves to compute and to load, not a serving latency.

The constants are the ones the project states elsewhere (``sim.prefill.PrefillModel``, the
capacity benchmark's ``device_tflops`` / ``mfu`` / ``load_gbps``, the ``recompute_tflops``
and ``tier_read_gbps`` defaults of the connector's config), so every modeled figure of the
project uses the same hardware. No GPU run of the project has measured them yet
(``benchmarks/gpu/README.md``: "Not measured yet").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.sim.prefill import PrefillModel

#: H200 SXM dense BF16 tensor-core peak, FLOP/s: NVIDIA H200 datasheet, "BF16 Tensor Core
#: 1,979 TFLOPS" with 2:4 sparsity, i.e. 989 TFLOP/s dense (the same SMs and clocks as H100
#: SXM; H200 differs in HBM3e capacity and bandwidth).
PEAK_BF16_FLOPS = 989e12
#: Model FLOPs utilisation of a long prefill: 0.45, the project's stated figure
#: (``recompute_tflops`` default 445 = 989 x 0.45; ``sim.prefill``; the capacity benchmark),
#: an assumption, not a measurement of this model's kernels.
MFU = 0.45
#: Fixed cost per request, seconds: scheduling, kernel launches, the first token's decode
#: (``sim.prefill.PrefillModel.overhead_s``, the capacity benchmark's ``overhead_ms``).
OVERHEAD_S = 0.010
#: Read bandwidth into the GPU per tier, GB/s (10^9 B/s): the connector config's
#: ``tier_read_gbps`` defaults and the capacity benchmark's ``load_gbps``. Host: 25 GB/s,
#: an effective figure for block-sized copies from pinned memory over PCIe Gen5 x16 (64 GB/s
#: per direction raw; ``cudaMemcpy`` bandwidth tests reach ~55 GB/s on large pinned buffers,
#: so 25 is a conservative effective rate). NVMe: 6 GB/s (one PCIe Gen4 x4 drive's
#: sequential read, ~7 GB/s raw). An HGX H200's host link is PCIe Gen5 (GH200's NVLink-C2C
#: would read host memory several times faster).
LOAD_GBPS: dict[str, float] = {"host": 25.0, "nvme": 6.0}

SOURCES = {
    "peak_bf16_flops": "NVIDIA H200 SXM datasheet: BF16 1,979 TFLOP/s with sparsity, 989 dense",
    "mfu": "project default (recompute_tflops 445 = 989 x 0.45; sim.prefill)",
    "overhead_s": "project default (sim.prefill overhead, capacity benchmark overhead_ms)",
    "load_gbps": "project defaults (tier_read_gbps, capacity benchmark load_gbps): host "
                 "pinned over PCIe Gen5 x16 25 GB/s effective, NVMe 6 GB/s",
}


@dataclass(frozen=True)
class TTFTModel:
    """The model of the module docstring for one unscaled ``geometry`` at token ``divisor``
    and byte ``byte_factor`` (scaled bytes x it = full-size bytes)."""

    geometry: ModelGeometry
    divisor: float
    byte_factor: float
    peak_flops: float = PEAK_BF16_FLOPS
    mfu: float = MFU
    overhead_s: float = OVERHEAD_S
    load_gbps: dict[str, float] = field(default_factory=lambda: dict(LOAD_GBPS))

    def compute_s(self, prompt: int, hit: int) -> float:
        """Seconds to prefill ``[hit, prompt)`` (scaled tokens) of the unscaled model."""
        real_prompt, real_hit = round(prompt * self.divisor), round(hit * self.divisor)
        flops = PrefillModel().compute_flops(self.geometry, real_prompt, real_hit)
        return flops / (self.peak_flops * self.mfu)

    def load_s(self, scaled_bytes: float, tier: str = "host") -> float:
        """Seconds to load ``scaled_bytes`` (scaled geometry) from ``tier``, at full size."""
        return scaled_bytes * self.byte_factor / (self.load_gbps[tier] * 1e9)

    def requests(self, detail: Sequence[tuple[int, int, int]], loaded_bytes: float,
                 tier: str = "host", disk_bytes: float = 0.0) -> list[tuple[float, float]]:
        """(compute s, load s) per request of ``detail`` = (prompt, hit, external hit) in
        scaled tokens; ``loaded_bytes`` (the run's, scaled) shared in proportion to the
        external hit tokens (evenly where no request had one: loads vLLM did not count as
        hits, e.g. failed ones, still took the link). ``disk_bytes`` of them were read from
        disk first: they add their time at the ``nvme`` rate (module docstring)."""
        if not detail:
            return []
        ext = sum(e for _, _, e in detail)
        share = [e / ext for _, _, e in detail] if ext else [1 / len(detail)] * len(detail)
        return [(self.compute_s(p, h),
                 self.load_s(loaded_bytes * w, tier) + self.load_s(disk_bytes * w, "nvme"))
                for (p, h, _), w in zip(detail, share, strict=True)]

    def summary(self, detail: Sequence[tuple[int, int, int]], loaded_bytes: float,
                tier: str = "host", disk_bytes: float = 0.0) -> dict[str, float]:
        """Mean, p50 and p90 modeled TTFT (ms) of a run, and the mean compute and load parts."""
        parts = self.requests(detail, loaded_bytes, tier, disk_bytes)
        if not parts:
            return {"mean_ms": 0.0, "p50_ms": 0.0, "p90_ms": 0.0, "compute_ms": 0.0, "load_ms": 0.0}
        comp = np.asarray([c for c, _ in parts]) * 1e3
        load = np.asarray([x for _, x in parts]) * 1e3
        tot = comp + load + self.overhead_s * 1e3
        return {"mean_ms": float(tot.mean()), "p50_ms": float(np.percentile(tot, 50)),
                "p90_ms": float(np.percentile(tot, 90)), "compute_ms": float(comp.mean()),
                "load_ms": float(load.mean())}

    def load_gate(self) -> dict[str, Any]:
        """The ``load_gate`` config block that weighs loads as this model does, for the
        scaled model ours runs: per scaled token the FLOPs of the ``divisor`` real tokens it
        stands for (``flops_per_token``, a linear part ``a`` and ``b`` per earlier real token:
        ``a d + b d (d - 1) / 2``) plus ``b d^2`` per scaled token before it, bytes x
        ``byte_factor``, the same rates and tier bandwidths."""
        f = partial(PrefillModel().compute_flops, self.geometry, hit=0)
        b = (f(2000) - 2 * f(1000)) / 1e6  # f(n) = a n + b n (n - 1) / 2
        a, d = f(1000) / 1000 - b * 999 / 2, self.divisor
        # YAML reads 4.1e7 without a point as a string: plain floats
        return {"enabled": True, "prefill_tflops": self.peak_flops * self.mfu / 1e12,
                "flops_per_token": float(round(a * d + b * d * (d - 1) / 2)),
                "flops_per_position": float(round(b * d * d)),
                "byte_scale": float(self.byte_factor),
                "tier_gbps": {"host": self.load_gbps["host"], "nvme": self.load_gbps["nvme"]}}

    def constants(self) -> dict[str, Any]:
        """What the report states: the figures, the scale factors and their sources."""
        return {"model": self.geometry.name, "peak_bf16_tflops": self.peak_flops / 1e12,
                "mfu": self.mfu, "overhead_ms": self.overhead_s * 1e3,
                "load_gbps": dict(self.load_gbps), "token_factor": self.divisor,
                "byte_factor": self.byte_factor, "sources": dict(SOURCES)}


def for_preset(preset: str, divisor: float) -> TTFTModel:
    """The model for the scaled ``preset`` at ``divisor`` (``geometry.scaled``)."""
    from hybrid_connector.geometry.presets import get_preset
    from hybrid_connector.geometry.scaled import scaled_geometry

    sg = scaled_geometry(preset, divisor)
    factor = divisor * sg.real.kv_bytes_per_token / sg.scaled.kv_bytes_per_token
    return TTFTModel(get_preset(preset), divisor, factor)


def best_vllm_ratios(rows: Iterable[dict[str, Any]], vllm_peers: Sequence[str]) -> None:
    """Set each row's ``ttft_vs_best_vllm``: its mean modeled TTFT over the lowest of
    ``vllm_peers``' at the same trace and host budget (None for a row without a budget, or
    where none of them ran)."""
    rows = list(rows)
    best: dict[tuple[str, float], float] = {}
    for r in rows:
        if r["peer"] in vllm_peers and r["multiple"] is not None:
            k = (r["trace"], r["multiple"])
            best[k] = min(best.get(k, float("inf")), r["ttft"]["mean_ms"])
    for r in rows:
        b = best.get((r["trace"], r["multiple"])) if r["multiple"] is not None else None
        r["ttft_vs_best_vllm"] = r["ttft"]["mean_ms"] / b if b else None
