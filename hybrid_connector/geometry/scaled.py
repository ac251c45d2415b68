"""Real proportions at toy size: a hybrid preset scaled down so a CPU run takes minutes.

A prefix cache for a hybrid model is shaped by three figures and their ratios to the trace
lengths: the engine's block size (hits land only on its multiples), the KV bytes of one
token and the bytes of one recurrent-state checkpoint. :func:`scaled_geometry` keeps those
ratios of a real preset (Qwen3.5-4B, Nemotron-H-8B) with every token count divided by
``divisor`` (the same ``scale`` the trace generators of ``sim.traces_engine`` take) and every
byte count of one token divided by one constant shared by all presets:

* **layers**: the first ``1 / layer_divisor`` of the real pattern, which holds each layer kind
  in the real proportion (Qwen3.5-4B: 6 GDN + 2 attention of 24 + 8; Nemotron-H: 6 Mamba2,
  1 attention, 6 MLP of 24, 4, 24), so state bytes / KV bytes per token follow the per-layer
  ratio alone;
* **attention**: the same tiny dims for every preset (4 heads, 1 KV head of 16), as the real
  models share 4,096 KV bytes per layer and token, so KV bytes per token keep their ratio
  across presets (Qwen3.5-4B has twice Nemotron-H's);
* **recurrent dims**: searched so that one layer's state page over one layer's KV bytes per
  token (vLLM's block-size driver) is the real one over ``divisor``: Qwen3.5-4B 524 -> 32.75
  at 16, so one state is the KV of 1,572 / 16 = 98.25 tokens and the block is 528 / 16 = 33.

vLLM's hybrid block size (``vllm/platforms/interface.py``,
``Platform._align_hybrid_block_size``) is the smallest multiple of the kernel's block
alignment whose attention page (block x one layer's KV bytes per token) holds one Mamba
layer's state page: ``align * cdiv(state_page, align * kv_page_per_token)``, then rounded
to every backend's alignment. On a GPU FlashAttention's alignment is 16
(``flash_attn.py``: ``MultipleOf(16)``), which gives Qwen3.5-4B 528 and Nemotron-H-8B 1,040;
at scale the alignment is ``round(16 / divisor)`` (1 at 16). (On Hopper with FlashInfer
installed, vLLM's GDN prefill exports align-mode checkpoints on a 64-token grid
(``qwen_gdn_linear_attn.py``, ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``), which makes
Qwen3.5-4B's block 576: ``cache_figures(geom, 64)``; Mamba2 layers declare no grid.) vLLM's
CPU backend aligns to
32 (``cpu_attn.py``: ``MultipleOf(32)``), so a CPU engine rounds the scaled block up to a
multiple of 32; :func:`cpu_exact_divisor` picks the divisor near a wanted one at which the
real block over it is such a multiple (Qwen3.5-4B: 16.5 -> 32; Nemotron-H: 16.25 -> 64).

``geometry_scaled_hf`` writes the scaled models' ``config.json`` and asks vLLM's own code
which block size it computes for them.
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass
from typing import Any

from hybrid_connector.geometry.model import AttentionDims, GDNDims, Mamba2Dims, ModelGeometry
from hybrid_connector.geometry.presets import get_preset

__all__ = [
    "CPU_KERNEL_ALIGNMENT", "GPU_KERNEL_ALIGNMENT", "CacheFigures", "ScaledGeometry",
    "cache_figures", "cpu_exact_divisor", "hybrid_block_size", "proportions_table",
    "scaled_geometry",
]

GPU_KERNEL_ALIGNMENT = 16  # vLLM 0.33 FlashAttention: get_supported_kernel_block_sizes
CPU_KERNEL_ALIGNMENT = 32  # vLLM 0.33 CPU_ATTN: get_supported_kernel_block_sizes
SCALABLE = ("qwen3.5-4b", "qwen3.5-0.8b", "nemotron-h-8b")  # GDN or Mamba2 + attention
_ATTN = AttentionDims(num_heads=4, num_kv_heads=1, head_dim=16)  # shared by every preset
_DIMS = range(8, 65, 4)  # recurrent head dims searched
_TOLERANCE = 0.01  # page-ratio error below which the real head ratios decide


def hybrid_block_size(state_page: int, kv_page_per_token: int, alignment: int) -> int:
    """vLLM 0.33's hybrid attention block size: the smallest multiple of ``alignment`` whose
    attention page (``block * kv_page_per_token``, one layer) is >= ``state_page`` (one
    Mamba layer's state), as ``Platform._align_hybrid_block_size`` computes it."""
    if min(state_page, kv_page_per_token, alignment) < 1:
        raise ValueError("page sizes and alignment must be >= 1")
    return alignment * math.ceil(state_page / (alignment * kv_page_per_token))


@dataclass(frozen=True)
class CacheFigures:
    """What shapes a hybrid prefix cache: the engine's block (tokens), KV bytes of one token
    (all attention layers), bytes of one state checkpoint (all recurrent layers), and the
    per-layer pages vLLM sizes its block from."""

    block_size: int
    kv_bytes_per_token: int
    state_bytes: int
    state_page: int
    kv_page_per_token: int

    @property
    def state_tokens(self) -> float:
        """One state checkpoint in tokens of KV."""
        return self.state_bytes / self.kv_bytes_per_token

    @property
    def page_ratio(self) -> float:
        """One layer's state page over one layer's KV bytes per token (tokens)."""
        return self.state_page / self.kv_page_per_token


def cache_figures(geom: ModelGeometry, alignment: int = GPU_KERNEL_ALIGNMENT) -> CacheFigures:
    """:class:`CacheFigures` of ``geom`` (one rank) with vLLM's block for kernel block
    ``alignment``. Raises ValueError for a model without both attention and recurrent
    layers (vLLM's alignment is for hybrids)."""
    n_attn, per_layer = len(geom.attention_layers), geom.state_bytes_per_layer()
    if not n_attn or not per_layer:
        raise ValueError(f"{geom.name}: not a hybrid of attention and recurrent layers")
    kv = geom.kv_bytes_per_token()
    page = max(per_layer.values())
    return CacheFigures(hybrid_block_size(page, kv // n_attn, alignment), kv,
                        geom.state_bytes(), page, kv // n_attn)


def _reduced_layers(layers: list[str], layer_divisor: int, name: str) -> list[str]:
    """The first ``len / layer_divisor`` layers, if they hold each kind in proportion."""
    n = len(layers)
    head = layers[: n // layer_divisor]
    if n % layer_divisor or any(head.count(k) * layer_divisor != layers.count(k) for k in set(layers)):
        raise ValueError(f"{name}: the first 1/{layer_divisor} of its layers do not hold each "
                         "kind in proportion; pick another layer_divisor")
    return head


def _state_elems(kind: str, dims: Any, b: int, bs: int) -> int:
    """Bytes of one layer's state (conv in ``b``-byte, recurrent in ``bs``-byte elements)."""
    if kind == "gdn":
        return (2 * dims.num_k_heads * dims.head_k_dim + dims.num_v_heads * dims.head_v_dim) * (
            dims.conv_kernel - 1) * b + dims.num_v_heads * dims.head_k_dim * dims.head_v_dim * bs
    return (dims.num_heads * dims.head_dim + 2 * dims.n_groups * dims.d_state) * (
        dims.conv_kernel - 1) * b + dims.num_heads * dims.head_dim * dims.d_state * bs


def _candidates(kind: str, real: Any) -> list[Any]:
    if kind == "gdn":
        return [GDNDims(nk, nk * m, dk, dv, real.conv_kernel)
                for nk, m, dk, dv in itertools.product((1, 2), (1, 2, 4), _DIMS, _DIMS)]
    return [Mamba2Dims(h, p, n, g, real.conv_kernel)
            for h, g, p, n in itertools.product((1, 2, 4, 8), (1, 2), _DIMS, _DIMS) if h % g == 0]


def _shape_penalty(kind: str, real: Any, d: Any) -> float:
    """How far a candidate's head ratios are from the real model's (a tie-break)."""
    if kind == "gdn":
        pairs = [(real.num_v_heads / real.num_k_heads, d.num_v_heads / d.num_k_heads),
                 (real.head_k_dim / real.head_v_dim, d.head_k_dim / d.head_v_dim)]
    else:
        pairs = [(real.head_dim / real.d_state, d.head_dim / d.d_state)]
    return sum(abs(math.log(a / b)) for a, b in pairs)


def _solve(kind: str, real: Any, target: float, want_block: int, kv_page: int, alignment: int,
           b: int, bs: int) -> Any:
    """The recurrent dims whose page ratio is nearest ``target`` among those giving vLLM's
    block ``want_block`` (in steps of :data:`_TOLERANCE`), then nearest the real head
    ratios, then smallest."""
    def key(d: Any) -> tuple[int, int, float, int]:
        page = _state_elems(kind, d, b, bs)
        miss = hybrid_block_size(page, kv_page, alignment) != want_block
        err = abs(page / kv_page - target) / target
        return miss, int(err / _TOLERANCE), _shape_penalty(kind, real, d), page
    return min(_candidates(kind, real), key=key)


@dataclass(frozen=True)
class ScaledGeometry:
    """A preset at toy size: ``geometry`` (tiny dims, the real layer proportions) and its
    figures next to the real ones. ``alignment`` is the kernel block alignment at scale."""

    preset: str
    divisor: float
    layer_divisor: int
    geometry: ModelGeometry
    real: CacheFigures
    scaled: CacheFigures
    alignment: int

    @property
    def ideal_block(self) -> float:
        """The real block over ``divisor``: what the scaled block stands for."""
        return self.real.block_size / self.divisor

    def ratios(self) -> dict[str, float]:
        """Each scaled figure over the real one taken to scale (1.0: exact). Token counts
        are divided by ``divisor``; byte counts of one token by ``kv_byte_divisor``, the same
        for every preset at one ``layer_divisor``."""
        kv_div = _kv_byte_divisor(self.layer_divisor)
        return {
            "block": self.scaled.block_size / self.ideal_block,
            "state_tokens": self.scaled.state_tokens / (self.real.state_tokens / self.divisor),
            "kv_bytes_per_token": self.scaled.kv_bytes_per_token * kv_div / self.real.kv_bytes_per_token,
            "state_bytes": self.scaled.state_bytes * kv_div * self.divisor / self.real.state_bytes,
        }

    def cpu_block_size(self, block_size: int = CPU_KERNEL_ALIGNMENT) -> int:
        """The block vLLM's CPU platform computes for this geometry when the user asks for
        ``block_size`` (``CpuPlatform.update_block_size_for_backend``: the alignment is the
        larger of CPU_ATTN's 32 and the asked size, then a multiple of 32)."""
        a = max(CPU_KERNEL_ALIGNMENT, block_size)
        blk = hybrid_block_size(self.scaled.state_page, self.scaled.kv_page_per_token, a)
        return CPU_KERNEL_ALIGNMENT * math.ceil(blk / CPU_KERNEL_ALIGNMENT)


def _kv_byte_divisor(layer_divisor: int) -> int:
    """Real KV bytes per layer and token (4,096 for every scalable preset) over the scaled
    ones (float32, :data:`_ATTN`), times the layers dropped."""
    return 4096 // (2 * _ATTN.num_kv_heads * _ATTN.head_dim * 4) * layer_divisor


def scaled_geometry(preset: str, divisor: float, *, layer_divisor: int = 4,
                    vocab_size: int = 32000, hidden_size: int = 64,
                    intermediate_size: int = 128) -> ScaledGeometry:
    """``preset`` (one of :data:`SCALABLE`) with token counts divided by ``divisor`` (>= 1)
    and the first ``1 / layer_divisor`` of its layers, in float32 (KV, conv and recurrent
    state, as the CPU harnesses run). ``vocab_size`` defaults to the trace generators'.
    Raises ValueError for another preset, a divisor < 1 or a layer_divisor that breaks the
    layer proportions."""
    key = preset.strip().lower()
    if key not in SCALABLE:
        raise ValueError(f"cannot scale {preset!r}; scalable presets: {', '.join(SCALABLE)}")
    if not divisor >= 1:
        raise ValueError(f"divisor must be >= 1, got {divisor!r}")
    real = get_preset(key)
    if real.kv_bytes_per_token() // len(real.attention_layers) != 4096:
        raise ValueError(f"{key}: the shared attention dims assume 4,096 KV bytes per layer and token")
    figs = cache_figures(real)
    alignment = max(1, round(GPU_KERNEL_ALIGNMENT / divisor))
    kind = "gdn" if real.gdn is not None else "mamba2"
    real_dims = real.gdn if real.gdn is not None else real.mamba2
    kv_page = 2 * _ATTN.num_kv_heads * _ATTN.head_dim * 4
    target = figs.page_ratio / divisor
    dims = _solve(kind, real_dims, target, alignment * math.ceil(target / alignment), kv_page,
                  alignment, 4, 4)
    d = real.to_dict()
    layers = _reduced_layers(d["layers"], layer_divisor, key)
    attn = {"num_heads": _ATTN.num_heads, "num_kv_heads": _ATTN.num_kv_heads,
            "head_dim": _ATTN.head_dim, "output_gate": real.attention is not None and real.attention.output_gate}
    assert real.mlp is not None
    geom = ModelGeometry.from_dict({
        "name": f"{real.name}/scaled-{divisor:g}", "architecture": real.architecture,
        "hidden_size": hidden_size, "vocab_size": vocab_size, "layers": layers,
        "attention": attn, kind: {f: getattr(dims, f) for f in dims.__dataclass_fields__},
        "mlp": {"intermediate_size": intermediate_size, "gated": real.mlp.gated},
        "dtype": "float32", "state_dtype": "float32",
    }, source=f"scaled {key}")
    return ScaledGeometry(key, divisor, layer_divisor, geom, figs, cache_figures(geom, alignment),
                          alignment)


def cpu_exact_divisor(preset: str, near: float) -> float:
    """The divisor nearest ``near`` at which ``preset``'s real block over it is a multiple
    of vLLM CPU's kernel alignment (32), so a CPU engine's block is the real one to scale."""
    block = cache_figures(get_preset(preset)).block_size
    k = max(1, round(block / (CPU_KERNEL_ALIGNMENT * near)))
    return block / (CPU_KERNEL_ALIGNMENT * k)


def proportions_table(presets: tuple[str, ...] = ("qwen3.5-4b", "nemotron-h-8b"),
                      divisors: tuple[float, ...] = (16, 8)) -> list[dict[str, Any]]:
    """One row per preset: the real figures, then per divisor the scaled ones, the ratios
    and the block a CPU vLLM computes (asked for 32)."""
    rows: list[dict[str, Any]] = []
    for p in presets:
        for s in divisors:
            sg = scaled_geometry(p, s)
            rows.append({"preset": p, "divisor": s, "real": sg.real, "scaled": sg.scaled,
                         "ratios": sg.ratios(), "cpu_block": sg.cpu_block_size(),
                         "recurrent": sg.geometry.gdn or sg.geometry.mamba2})
    return rows


def _fmt(f: CacheFigures) -> str:
    return (f"block {f.block_size:>5}  KV/token {f.kv_bytes_per_token:>6} B  state "
            f"{f.state_bytes:>10,} B  state = KV of {f.state_tokens:8.2f} tokens")


def main(argv: list[str] | None = None) -> None:
    """Print :func:`proportions_table` (``python -m hybrid_connector.geometry.scaled``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--presets", nargs="+", default=["qwen3.5-4b", "nemotron-h-8b"])
    ap.add_argument("--divisors", nargs="+", type=float, default=[16.0, 8.0])
    args = ap.parse_args(argv)
    for row in proportions_table(tuple(args.presets), tuple(args.divisors)):
        print(f"{row['preset']} / {row['divisor']:g}\n  real   {_fmt(row['real'])}\n"
              f"  scaled {_fmt(row['scaled'])}  (CPU vLLM block {row['cpu_block']})\n"
              f"  ratios {({k: round(v, 4) for k, v in row['ratios'].items()})}\n"
              f"  dims   {row['recurrent']}")


if __name__ == "__main__":
    main()
