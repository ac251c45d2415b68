"""The two compute modes of the capacity benchmark.

* ``modeled``: TTFT = overhead + FLOPs of the tokens recomputed (the chosen geometry's
  per-family FLOPs, attention over each token's causal context, ``sim.prefill``) at
  ``device_tflops`` x ``mfu``, + each loaded object's full-size bytes over its tier's
  stated load bandwidth. The cost ratios of the real model (recompute vs load, state vs
  KV) are represented; the absolute milliseconds are those of the stated hardware.
* ``real``: a transformers hybrid model runs every prefill on this machine (the shipped
  trained tiny Qwen3.5 by default) through ``HFRuntime``: restore what the cache loaded,
  run the rest; TTFT is measured wall time. Objects are the model's own KV and states.
"""

from __future__ import annotations

from typing import Any

import torch

from hybrid_connector.bench.schema import CapacityConfig
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.plan import LoadPlan
from hybrid_connector.sim.prefill import PrefillModel

TIER_BW_NAME = {"device": "device", "host": "host", "nvme": "nvme", "disk": "nvme"}


class ModeledCompute:
    """Modeled TTFT (see the module docstring); ``geo`` gives FLOPs, bytes are scaled back
    to full size with ``byte_scale``."""

    def __init__(self, cfg: CapacityConfig, geo: ModelGeometry) -> None:
        self.geo = geo
        self.scale = cfg.byte_scale
        self.prefill = PrefillModel(peak_flops=cfg.device_tflops * 1e12, mfu=cfg.mfu,
                                    load_bw=1.0, overhead_s=cfg.overhead_ms / 1e3)
        self.bw = {k: v * 1e9 for k, v in cfg.load_gbps.items()}

    def parts(self, prompt: int, hit: int, plan: LoadPlan | None) -> tuple[float, float, float]:
        """(overhead, recompute, loads) seconds of one request; TTFT is their sum."""
        compute = self.prefill.ttft(self.geo, prompt, hit, 0) - self.prefill.overhead_s
        load = 0.0
        if plan is not None and hit:
            load = sum(o.ref.nbytes * self.scale / self.bw[TIER_BW_NAME[o.tier]] for o in plan.objects)
        return self.prefill.overhead_s, compute, load

    def ttft(self, prompt: int, hit: int, plan: LoadPlan | None) -> float:
        return sum(self.parts(prompt, hit, plan))


def real_model(cfg: CapacityConfig) -> Any:
    """The transformers model of ``compute: real`` (fp32, eval, one thread on CPU)."""
    torch.set_num_threads(1)
    if cfg.real.model == "trained":
        from hybrid_connector.integrations.hf.trained import load_trained_model

        return load_trained_model()
    from hybrid_connector.geometry.tiny import tiny_hf_model

    torch.manual_seed(0)
    return tiny_hf_model("qwen3_5").eval()


def model_vocab(model: Any) -> int:
    return int(model.config.vocab_size)
