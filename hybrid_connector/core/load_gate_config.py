"""The ``load_gate`` configuration block (``config.HybridConfig.load_gate``): the figures the
FLOP-aware load gate (``hybrid_connector.policies.admission.load_gate``) weighs a slow-tier
load against recomputing with. Defaults: an H200 serving the model at MFU 0.45 (989 dense
BF16 TFLOP/s x 0.45 = 445), host reads at 25 GB/s, NVMe at 6, a remote store at 2: the
figures of ``recompute_tflops`` / ``tier_read_gbps`` and of the head-to-head's modeled TTFT
(``bench/vllm_peers/ttft.py``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hybrid_connector.core.config_types import Strict

Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


class TierGbps(Strict):
    """Read bandwidth per tier into the engine, GB/s (10^9 bytes/s). A read from ``nvme``
    or ``remote`` is staged in host memory: its time adds the ``host`` hop."""

    device: Positive = 1500.0
    host: Positive = 25.0
    nvme: Positive = 6.0
    remote: Positive = 2.0


class LoadGate(Strict):
    """``enabled`` (default off): refuse a hit whose slow-tier objects take longer to load
    than recomputing the tokens they add over the next-best hit. ``prefill_tflops``: the
    effective prefill rate. ``flops_per_token``: None takes the model's FLOPs from its
    geometry (every layer, attention over each token's causal context); a number is a flat
    rate per token, e.g. for a scaled-down stand-in model whose token stands for many real
    ones, plus ``flops_per_position`` per token before it (attention over its context; 0).
    ``byte_scale``: stored bytes x this = the bytes a load is costed at (1; a stand-in
    model's byte ratio to the real one)."""

    enabled: bool = False
    prefill_tflops: Positive = 445.0
    flops_per_token: Positive | None = None
    flops_per_position: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    byte_scale: Positive = 1.0
    tier_gbps: TierGbps = TierGbps()
