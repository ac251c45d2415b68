"""The FLOP-aware load gate: of the hits a prompt could take, the one that reaches its first
token soonest, loads and recompute together (``load_gate`` config block).

A hit of p tokens costs the time to load its objects (those the engine lacks) plus the time
to prefill the rest of the prompt ``[p, prompt)``; the gate returns the option with the
least modeled time. The options are the deepest hit, shallower hits (a checkpoint further
up the same path, often on a faster tier) and the engine's own local hit (nothing loaded).
A deep hit whose state sits on disk thus loses to a shallower one, or to recomputing, when
it extends that hit by fewer tokens than its extra bytes take to read (Qwen3.5-4B at full
size: a 49 MiB state from NVMe at 6 GB/s + the host copy at 25 GB/s takes ~11 ms, the
prefill of ~630 tokens at 445 TFLOP/s).

Cost model (``LoadCost``): ``compute_s(since, end)`` = FLOPs of ``[since, end)`` after
``since`` tokens (``ModelGeometry.flops_saved``, or ``flops_per_token`` per token plus
``flops_per_position`` per token before it) over the
effective prefill rate; ``load_s(bytes by tier)`` = bytes x ``byte_scale`` over each tier's
read rate, plus the host hop for a tier staged through host memory (nvme, remote). Loads
and compute are added, not overlapped (the bench's modeled TTFT does the same). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hybrid_connector.core.load_gate_config import LoadGate
from hybrid_connector.geometry.model import ModelGeometry

#: Tier names as plans report them -> the config's ``tier_gbps`` field.
TIER_FIELD = {"device": "device", "host": "host", "nvme": "nvme", "disk": "nvme",
              "remote": "remote"}
#: Tiers read into host memory first (their time adds the host hop).
STAGED = frozenset({"nvme", "remote"})


@dataclass(frozen=True, slots=True)
class Option:
    """One hit the engine could take: ``tokens`` it skips computing and the bytes it must
    load for them, per tier (empty for the engine's own local hit)."""

    tokens: int
    load_bytes: Mapping[str, int] = field(default_factory=dict)


class LoadCost:
    """Seconds to load bytes from a tier and to prefill tokens (module docstring)."""

    def __init__(self, gate: LoadGate, geometry: ModelGeometry | None = None) -> None:
        if gate.flops_per_token is None and geometry is None:
            raise ValueError("load_gate: flops_per_token unset and no geometry to count FLOPs")
        self.geometry = geometry
        self.flops_per_token = gate.flops_per_token
        self.flops_per_position = gate.flops_per_position
        self.flops_per_s = gate.prefill_tflops * 1e12
        self.byte_scale = gate.byte_scale
        rates = gate.tier_gbps
        self.bps = {name: getattr(rates, f) * 1e9 for name, f in TIER_FIELD.items()}
        self._slowest = min(self.bps.values())

    def compute_s(self, since: int, end: int) -> float:
        """Seconds to prefill ``[since, end)`` after ``since`` tokens (0 when empty)."""
        n = end - since
        if n <= 0:
            return 0.0
        if self.flops_per_token is not None:
            context = n * since + n * (n - 1) // 2  # tokens before each of the n
            return (n * self.flops_per_token + context * self.flops_per_position) / self.flops_per_s
        assert self.geometry is not None
        return self.geometry.flops_saved(n, since).total / self.flops_per_s

    def load_s(self, load_bytes: Mapping[str, int]) -> float:
        """Seconds to read ``load_bytes`` (tier -> bytes); an unknown tier reads at the
        slowest configured rate (and through host memory)."""
        total = 0.0
        host = self.bps["host"]
        for tier, nbytes in load_bytes.items():
            b = nbytes * self.byte_scale
            name = TIER_FIELD.get(tier)
            total += b / self.bps.get(tier, self._slowest)
            if name is None or name in STAGED:
                total += b / host
        return total

    def time_s(self, option: Option, prompt: int) -> float:
        """Modeled seconds to the first token's prefill with ``option``."""
        return self.load_s(option.load_bytes) + self.compute_s(option.tokens, prompt)


def cheapest(options: Sequence[Option], prompt: int, cost: LoadCost) -> int:
    """Index of the option with the least ``cost.time_s`` for a prompt of ``prompt``
    tokens; on a tie, the deeper hit (more tokens served), then the earlier option.
    Raises ValueError for no options."""
    if not options:
        raise ValueError("cheapest: no options")
    best, best_key = 0, (0.0, 0)
    for i, o in enumerate(options):
        key = (cost.time_s(o, prompt), -o.tokens)
        if i == 0 or key < best_key:
            best, best_key = i, key
    return best
