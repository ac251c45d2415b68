"""Modeled time to first token (TTFT): a smooth prefill-time model, not a measurement.

``ttft = overhead + FLOPs to compute / (peak * mfu) + bytes loaded / load_bw + replay``

* FLOPs to compute are ``ModelGeometry.flops_saved(n - p, p)``: every layer over the tokens
  ``[p, n)`` with attention over each token's causal context, so the model is quadratic in
  the tokens to compute through attention and linear elsewhere (the shape of a measured
  prefill profile such as the reference's Jamba-1.5-Mini curve, which we cannot measure
  here).
* Loads are the hit's bytes (KV chunks, the checkpoint or anchors) over one host-to-device
  link; approximate hits add the replay of their window through the recurrent layers.

Defaults are H100-class assumptions (989 TFLOP/s bf16 dense, 45% MFU, 25 GB/s effective
PCIe 5 x16, 10 ms fixed scheduling and launch overhead). Change them to model other
hardware; the policy ordering does not depend on them, the absolute milliseconds do.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid_connector.geometry.model import ModelGeometry

RECURRENT_FAMILIES = ("mamba2", "gdn", "mamba1", "short_conv")


@dataclass(frozen=True)
class PrefillModel:
    """Constants of the TTFT model (see module docstring)."""

    peak_flops: float = 989e12
    mfu: float = 0.45
    load_bw: float = 25e9
    overhead_s: float = 0.010

    def compute_flops(self, geometry: ModelGeometry, prompt: int, hit: int) -> float:
        """FLOPs to prefill ``[hit, prompt)`` after a hit of ``hit`` tokens."""
        return geometry.flops_saved(max(0, prompt - hit), hit).total

    def replay_flops(self, geometry: ModelGeometry, start: int, end: int) -> float:
        """FLOPs of replaying ``[start, end)`` through the recurrent layers only."""
        if end <= start:
            return 0.0
        fb = geometry.flops_saved(end - start, start)
        return sum(getattr(fb, f) for f in RECURRENT_FAMILIES)

    def ttft(
        self, geometry: ModelGeometry, prompt: int, hit: int, loaded_bytes: int = 0,
        replay_from: int | None = None,
    ) -> float:
        """Seconds to the first token for a prompt of ``prompt`` tokens and a hit of ``hit``."""
        flops = self.compute_flops(geometry, prompt, hit)
        if replay_from is not None:
            flops += self.replay_flops(geometry, replay_from, hit)
        return self.overhead_s + flops / (self.peak_flops * self.mfu) + loaded_bytes / self.load_bw
