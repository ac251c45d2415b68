"""Report of the trained-model replay sweep (``hf_quality --trained``): JSON, table, plot,
and the gate calibrated from it.

:func:`gates_from_rows` builds one :class:`~hybrid_connector.runtime.suffix_replay.ReplayGate` per anchor
density rho from the *trained* model's per-prompt measurements (thresholds: the config
defaults ``replay_max_kl`` and ``replay_min_top1``), so the gate admits a budget k only
where every measured prompt passed at the largest passing k' <= k and at every measured k
between. :func:`write_report` writes ``replay_quality_trained.{json,md,png}`` under ``out``
(``replay_quality_trained_<arch>.*`` for another arch than Qwen3.5).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybrid_connector.runtime.suffix_replay import ReplayGate, ReplayQuality

MAX_KL = 0.05
MIN_TOP1 = 0.9
ARCH_NAMES = {"qwen3_5": "Qwen3.5", "nemotron_h": "Nemotron-H (Mamba2)"}


def gates_from_rows(rows: Sequence[dict[str, Any]], model: str = "trained",
                    max_kl: float = MAX_KL, min_top1: float = MIN_TOP1) -> dict[float, ReplayGate]:
    """One gate per rho, calibrated on ``model``'s per-prompt measurements in ``rows``."""
    gates: dict[float, ReplayGate] = {}
    for r in rows:
        if r["model"] != model:
            continue
        gate = gates.setdefault(float(r["rho"]), ReplayGate(max_kl, min_top1))
        for q in r["per_prompt"]:
            gate.record(ReplayQuality(**q))
    return gates


def _table(rows: Sequence[dict[str, Any]], gates: dict[float, ReplayGate]) -> list[str]:
    by = {(r["model"], r["rho"], r["k"]): r for r in rows}
    keys = sorted({(r["rho"], r["k"]) for r in rows}, key=lambda t: (-t[0], t[1]))
    lines = ["| rho | k (anchors) | span (tokens) | KL trained | KL random | top-1 trained | "
             "top-1 random | greedy trained | greedy random | gate (trained) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|"]
    for rho, k in keys:
        t, rnd = by.get(("trained", rho, k)), by.get(("random", rho, k))
        if t is None:
            continue
        g = gates.get(float(rho))
        verdict = "admit" if g is not None and g.admits(int(t["k_used"])) else "refuse"

        def f(r: dict[str, Any] | None, key: str, fmt: str) -> str:
            return format(r[key], fmt) if r is not None else "-"

        lines.append(f"| {rho:g} | {k} | {t['span_tokens']} | {f(t, 'kl_mean', '.3g')} | "
                     f"{f(rnd, 'kl_mean', '.3g')} | {f(t, 'top1', '.3f')} | {f(rnd, 'top1', '.3f')} | "
                     f"{f(t, 'greedy', '.3f')} | {f(rnd, 'greedy', '.3f')} | {verdict} |")
    return lines


def write_report(rows: Sequence[dict[str, Any]], out: str | Path, *, p: int, tokens: int,
                 page: int, arch: str = "qwen3_5") -> str:
    """Write JSON (all rows and the admitted ks per rho), a Markdown table and a plot; return
    the Markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gates = gates_from_rows(rows)
    admitted = {str(rho): sorted({int(r["k_used"]) for r in rows if r["model"] == "trained"
                                  and r["rho"] == rho and g.admits(int(r["k_used"]))})
                for rho, g in gates.items()}
    stem = "replay_quality_trained" + ("" if arch == "qwen3_5" else f"_{arch}")
    meta = {"arch": arch, "p": p, "tokens": tokens, "page": page, "max_kl": MAX_KL, "min_top1": MIN_TOP1,
            "text": "held-out stdlib files (hf_trained.corpus_files('heldout')), bytes"}
    (out / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "gate_admits_k": admitted, "rows": list(rows)}, indent=1) + "\n")
    md = [f"# Replay quality: trained tiny {ARCH_NAMES.get(arch, arch)} vs random weights\n",
          f"Prefix p={p} of {tokens}-byte held-out stdlib windows, suffix {tokens - p} tokens, "
          f"anchor page {page}; KL(full || replay) mean over suffix positions, top-1 agreement, "
          f"greedy agreement (16 tokens, up to the first divergence), means over prompts. Gate: "
          f"KL <= {MAX_KL}, top-1 and greedy >= {MIN_TOP1} on every prompt, calibrated per rho "
          f"on the trained model.\n", *_table(rows, gates), "",
          "Gate admits (k anchors, trained): " + "; ".join(
              f"rho={rho}: {ks if ks else 'nothing'}" for rho, ks in admitted.items()), ""]
    text = "\n".join(md)
    (out / f"{stem}.md").write_text(text)
    _plot(rows, out / f"{stem}.png")
    return text


def _plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    rhos = sorted({r["rho"] for r in rows}, reverse=True)
    for model, style in (("trained", "-o"), ("random", ":x")):
        for rho in rhos:
            rs = sorted((r for r in rows if r["model"] == model and r["rho"] == rho),
                        key=lambda r: r["k"])
            if not rs:
                continue
            ks = [r["k_used"] for r in rs]
            label = f"{model} rho={rho:g}"
            axes[0].plot(ks, [max(r["kl_mean"], 1e-9) for r in rs], style, label=label)
            axes[1].plot(ks, [r["top1"] for r in rs], style, label=label)
            axes[2].plot(ks, [r["greedy"] for r in rs], style, label=label)
    for ax, title in zip(axes, ("KL(full || replay), mean", "top-1 agreement", "greedy agreement"),
                         strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (anchors replayed)")
        ax.set_title(title)
    axes[0].set_yscale("log")
    axes[1].axhline(MIN_TOP1, c="grey", ls="--", lw=0.8)
    axes[1].axhline(0.94, c="red", ls=":", lw=0.8)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
