"""Train a tiny hybrid shipped in hybrid_connector/presets/trained*/ (CPU, minutes).

Byte tokens (hybrid_connector.integrations.hf.trained.encode) of the Python standard
library's top-level sources; held-out files are never trained on. AdamW with linear warmup
and cosine decay, random windows of --seq bytes, fixed seed (same steps -> same weights on
the same torch build; the wall-clock budget --minutes may stop it earlier, and the cosine
schedule then follows elapsed time). Training replaces the reference GDN kernel's batched
unit-lower-triangular solve with the equivalent inverse by repeated squaring (same maths,
:func:`_unit_lower_solve`; torch's batched solve_triangular is ~3x slower on CPU). Writes config.json + model.safetensors (fp16) to --out and the loss
curve to benchmarks/results/train_tiny_loss.{json,png}.

``--arch nemotron_h`` trains the tiny Nemotron-H (Mamba2 + attention + MLP layers,
``hf_trained.trained_config("nemotron_h")``; --hidden applies, --layers does not) into
hybrid_connector/presets/trained_nemotron_h/, its curve in
benchmarks/results/train_tiny_nemotron_h_loss.{json,png}; transformers' torch fallback runs
its Mamba2 layers (chunked scan).

    PYTHONPATH=. python scripts/train_tiny.py --minutes 6 --threads 2
    PYTHONPATH=. python scripts/train_tiny.py --arch nemotron_h --minutes 12 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from hybrid_connector.integrations.hf.trained import (
    TRAINED_ARCHS,
    VOCAB,
    corpus_tokens,
    mean_loss,
    model_class,
    trained_config,
    trained_dir,
)

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _unit_lower_solve(a: torch.Tensor, b: torch.Tensor, *, upper: bool,
                      unitriangular: bool = False, left: bool = True) -> torch.Tensor:
    """``T^-1 b`` for the unit lower-triangular ``T = I + tril(a, -1)`` (the only call the GDN
    reference kernel makes): with ``M = -tril(a, -1)`` nilpotent, ``T^-1 = sum_i M^i =
    prod_j (I + M^(2^j))``, a few batched matmuls instead of a sequential solve."""
    if upper or not unitriangular or not left:
        raise NotImplementedError("only the unit lower-triangular left solve is supported")
    m = -a.tril(-1)
    s = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device) + m
    p = m
    for _ in range(max(0, math.ceil(math.log2(a.shape[-1])) - 1)):
        p = p @ p
        s = s + s @ p
    return s @ b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=TRAINED_ARCHS, default="qwen3_5")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--minutes", type=float, default=6.0,
                    help="wall-clock budget: stop (and finish the schedule) when it is spent")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--out", type=Path, help="default: hf_trained.trained_dir(--arch)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    args.out = args.out or trained_dir(args.arch)
    torch.set_num_threads(args.threads)
    torch.linalg.solve_triangular = _unit_lower_solve
    torch.manual_seed(args.seed)
    if args.arch == "qwen3_5":
        pattern = ["linear_attention"] * 3 + ["full_attention"]
        cfg = trained_config(hidden_size=args.hidden, num_hidden_layers=args.layers,
                             layer_types=[pattern[i % 4] for i in range(args.layers)])
    else:
        cfg = trained_config(args.arch, hidden_size=args.hidden)
    model = model_class(args.arch)(cfg)
    params = sum(p.numel() for p in model.parameters())
    train, held = corpus_tokens("train"), corpus_tokens("heldout")
    print(f"params={params} train_bytes={train.numel()} heldout_bytes={held.numel()} vocab={VOCAB}")
    with torch.no_grad():
        model.eval()
        random_loss = mean_loss(model, held, args.seq, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = 10

    budget = args.minutes * 60

    def lr_at(step: int, elapsed: float) -> float:
        """Linear warmup (10 steps), then cosine to 0.1x over the step or time budget."""
        if step < warm:
            return (step + 1) / warm
        done = max((step - warm) / max(1, args.steps - warm), elapsed / budget)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))
    gen = torch.Generator().manual_seed(args.seed)
    curve: list[dict[str, float]] = [{"step": 0, "train": random_loss, "heldout": random_loss,
                                      "seconds": 0.0}]
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc="train", unit="step")
    ema = random_loss
    for step in bar:
        model.train()
        starts = torch.randint(0, train.numel() - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([train[s : s + args.seq] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_at(step, time.perf_counter() - t0)
        opt.step()
        ema = 0.9 * ema + 0.1 * float(loss.detach())
        last = time.perf_counter() - t0 >= budget
        bar.set_postfix(loss=f"{ema:.3f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps or last:
            model.eval()
            curve.append({"step": step + 1, "train": ema, "heldout": mean_loss(model, held, args.seq, 8),
                          "seconds": time.perf_counter() - t0})
            bar.write(f"step {step + 1}: train {ema:.3f} heldout {curve[-1]['heldout']:.3f} nats/byte")
        if last:
            break
    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()
             if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    save_file(state, str(args.out / "model.safetensors"))
    d = cfg.to_dict()
    keep = {k: d[k] for k in sorted(d) if k not in ("transformers_version", "architectures", "dtype",
                                                    "torch_dtype")}
    (args.out / "config.json").write_text(json.dumps(keep, indent=1, sort_keys=True) + "\n")
    summary = {"arch": args.arch, "params": params, "steps": int(curve[-1]["step"]), "minutes_budget": args.minutes, "batch": args.batch, "seq": args.seq,
               "lr": args.lr, "seed": args.seed, "threads": args.threads,
               "minutes": (time.perf_counter() - t0) / 60, "random_heldout": random_loss,
               "final_train": curve[-1]["train"], "final_heldout": curve[-1]["heldout"],
               "unit": "nats/byte", "curve": curve}
    args.results.mkdir(parents=True, exist_ok=True)
    stem = "train_tiny_loss" if args.arch == "qwen3_5" else f"train_tiny_{args.arch}_loss"
    (args.results / f"{stem}.json").write_text(json.dumps(summary, indent=1) + "\n")
    _plot(summary, args.results / f"{stem}.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "curve"}))


def _plot(summary: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = summary["curve"]
    assert isinstance(curve, list)
    steps = [c["step"] for c in curve]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [c["train"] for c in curve], label="train (EMA)")
    ax.plot(steps, [c["heldout"] for c in curve], label="held-out stdlib files")
    ax.axhline(math.log(VOCAB), ls=":", c="grey", label="uniform (ln 256)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    name = "Nemotron-H" if summary["arch"] == "nemotron_h" else "Qwen3.5"
    ax.set_title(f"tiny {name} hybrid, {summary['params']} params, "
                 f"{float(summary['minutes']):.1f} min CPU")  # type: ignore[arg-type]
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
