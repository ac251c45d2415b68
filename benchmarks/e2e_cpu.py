"""End-to-end TTFT on CPU: a Qwen3.5-architecture hybrid model (random weights) with the
transformers runtime, for no cache, exact checkpoints at branch points, and suffix replay.

Scenario at shared-prefix fraction f of an N-token prompt (S = f * N, page aligned):

* ``cold``: empty cache, the whole prompt is prefilled.
* ``exact (1st sharer)``: request A = prefix + tail, then B = prefix + other tail. B finds
  no state at S (A only checkpointed its own end), so it is cold, and it takes the
  branch-point checkpoint at S (Marconi admission) on the way.
* ``exact (warm)``: later requests C_i = prefix + tail_i hit the checkpoint at S exactly.
* ``replay (1st sharer)``: anchors on (admission ``last_token``: no branch checkpoints), A
  then B_i: the first sharer already hits at S by rebuilding the state from the last
  anchors (approximate, labelled; the gate was calibrated on this model first).

TTFT is the time from lookup to the first next-token logits (load + restore + replay +
suffix compute); saves happen after it (an engine does them asynchronously). All numbers
come from this run; the ratio cold/warm is printed against the cold baseline measured
here. ``--quick`` runs N=4096 at f=0.9 only (well under 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybrid_connector.core.config import load_config  # noqa: E402
from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.integrations.hf.quality import calibrate_gate, long_memory_  # noqa: E402
from hybrid_connector.integrations.hf.runtime import HFRuntime, PrefillInfo  # noqa: E402
from hybrid_connector.runtime.suffix_replay import ReplayGate  # noqa: E402
from hybrid_connector.tiers.memory import MemoryStore  # noqa: E402

PAGE = 64


def build_model(hidden: int, layers: int, max_pos: int, long_memory: bool) -> Any:
    """Qwen3.5 text architecture: 3 Gated DeltaNet layers then 1 gated attention layer,
    repeated; random weights (transformers' init), optionally with long-memory decay."""
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    types = (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)
    cfg = Qwen3_5TextConfig(
        vocab_size=4096, hidden_size=hidden, intermediate_size=3 * hidden,
        num_hidden_layers=len(types), layer_types=types, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=max_pos,
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, tie_word_embeddings=False,
        dtype="float32",
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    return long_memory_(model) if long_memory else model


def tokens(n: int, seed: int, vocab: int = 4096) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def make_runtime(model: Any, *, replay: bool, gate: ReplayGate | None = None) -> HFRuntime:
    over: dict[str, Any] = {
        "chunk_size": 256, "hash_block_size": 16, "alignment": 16,
        "anchor_page_size": PAGE, "anchor_density": 0.25, "replay": replay,
        "admission": "last_token" if replay else "marconi",
    }
    conf = load_config(overrides=over, environ={})
    store = MemoryStore({k: 8 << 30 for k in ObjectKind})
    return HFRuntime.create(model, conf, store, gate=gate)


def run(rt: HFRuntime, prompt: list[int]) -> PrefillInfo:
    res = rt.prefill(prompt)
    rt.finish(res)
    return res.info


def scenario(model: Any, n: int, frac: float, reps: int, gate: ReplayGate, seed: int) -> dict[str, Any]:
    s = int(frac * n) // PAGE * PAGE
    prefix = tokens(s, seed)

    def prompt(i: int) -> list[int]:
        return prefix + tokens(n - s, seed * 1000 + i)

    out: dict[str, Any] = {"tokens": n, "shared": s, "frac": frac}
    rt = make_runtime(model, replay=False)
    cold = [run(rt, prompt(0)).ttft]  # A: empty cache, a cold prefill
    b = run(rt, prompt(1))
    out["exact_first"] = b.ttft
    out["exact_first_hit"] = b.hit_tokens
    warm = [run(rt, prompt(2 + i)) for i in range(reps)]
    assert all(w.hit_tokens == s and w.exact for w in warm), [w.hit_tokens for w in warm]
    out["exact_warm"] = statistics.median(w.ttft for w in warm)
    out["state_bytes"] = rt.adapter.state_nbytes()
    rt.close()

    rt = make_runtime(model, replay=True, gate=gate)
    cold.append(run(rt, prompt(0)).ttft)  # A again on an empty cache: KV + anchors
    out["cold"] = statistics.median(cold)
    reps_info = [run(rt, prompt(10 + i)) for i in range(reps)]
    out["replay_first"] = statistics.median(r.ttft for r in reps_info)
    out["replay_hit"] = reps_info[0].hit_tokens
    out["replay_exact"] = reps_info[0].exact
    out["replay_gate_rejected"] = reps_info[0].gate_rejected
    out["replay_anchors"] = reps_info[0].replay_anchors
    out["replay_seconds"] = statistics.median(r.seconds.get("replay", 0.0) for r in reps_info)
    out["anchor_bytes_per_page"] = rt.layout.keep * len(rt.layout.groups) * rt.layout.hidden * 4
    rt.close()
    return out


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    top = max(results, key=lambda r: r["frac"])
    names = ["cold", "exact_first", "exact_warm", "replay_first"]
    labels = ["no cache", "exact\n(1st sharer)", "exact\n(warm)", "replay\n(1st sharer)"]
    vals = [top[k] for k in names]
    axes[0].bar(labels, vals, color=["#888", "#c96", "#393", "#36c"])
    for i, v in enumerate(vals):
        axes[0].text(i, v, f"{v:.2f}s\n{top['cold'] / v:.1f}x", ha="center", va="bottom", fontsize=8)
    axes[0].set_ylabel("TTFT (s)")
    axes[0].set_title(f"{top['tokens']} tokens, {top['frac']:.0%} shared prefix")
    fr = [r["frac"] for r in results]
    for k, lab in zip(names, labels, strict=True):
        axes[1].plot(fr, [r[k] for r in results], marker="o", label=lab.replace("\n", " "))
    axes[1].set_xlabel("shared prefix fraction")
    axes[1].set_ylabel("TTFT (s)")
    axes[1].set_title("TTFT vs shared prefix")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="N=2048, f=0.9, 2 reps")
    ap.add_argument("--long-memory", action="store_true",
                    help="set GDN decay/erase gates to remember hundreds of tokens")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--fracs", type=float, nargs="*", default=[0.5, 0.75, 0.9])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (0: torch default). 1 by default: on a shared 2-core "
                    "box two threads contend with co-tenants and get slower and far noisier")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.fracs, args.reps = 2048, [0.9], 2
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args.hidden, args.layers, max(32768, 2 * args.tokens), args.long_memory)
    print(f"model: Qwen3.5 arch, hidden {args.hidden}, {args.layers} layers, "
          f"{'long-memory' if args.long_memory else 'random-init'} decay, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
          f"torch threads {torch.get_num_threads()}")
    t = time.perf_counter()
    with torch.no_grad():  # first-call allocations are slow: keep them out of the numbers
        model(torch.tensor([tokens(args.tokens, 99)]), use_cache=True, logits_to_keep=1)
    print(f"warm-up prefill of {args.tokens} tokens: {time.perf_counter() - t:.2f}s")

    # Gate: calibrate replay quality on this model at the window the cache will use.
    cal_rt = make_runtime(model, replay=True)
    # The cache's window: replay_budget_frac * p rounded down to pages, at least one page;
    # calibrate at the k of every shared fraction this run uses.
    conf = cal_rt.config

    def k_at(frac: float) -> int:
        p = int(frac * args.tokens) // PAGE * PAGE
        window = min(int(conf.replay_budget_frac * p), conf.replay_max_tokens)
        return max(1, window // PAGE) * cal_rt.layout.keep

    ks = sorted({k_at(f) for f in args.fracs})
    gate = ReplayGate.from_config(conf)
    calibrate_gate(cal_rt, gate, [tokens(1024, 5)], [960], ks, continuation=32)
    for k in ks:
        q = gate.measured[k][0]
        print(f"replay calibration (1024 tokens, p=960, k={k} anchors): KL {q.kl_mean:.2e} "
              f"top1 {q.top1:.3f} cont32 {q.continuation:.3f} -> "
              f"{'admitted' if gate.admits(k) else 'REJECTED'} "
              f"(max_kl {gate.max_kl}, min_top1 {gate.min_top1})")
    cal_rt.close()

    results = []
    for frac in args.fracs:
        r = scenario(model, args.tokens, frac, args.reps, gate, seed=int(frac * 100))
        results.append(r)
        print(f"f={frac:.2f} shared={r['shared']:5d}  cold {r['cold']:.3f}s  "
              f"exact(1st) {r['exact_first']:.3f}s  exact(warm) {r['exact_warm']:.3f}s "
              f"[{r['cold'] / r['exact_warm']:.1f}x]  replay(1st) {r['replay_first']:.3f}s "
              f"[{r['cold'] / r['replay_first']:.1f}x, hit {r['replay_hit']}, exact={r['replay_exact']}, "
              f"{r['replay_anchors']} anchors, replay {r['replay_seconds'] * 1e3:.0f} ms]")
    top = max(results, key=lambda r: r["frac"])
    ratio = top["cold"] / top["exact_warm"]
    print(f"\ncold/warm TTFT at {top['frac']:.0%} shared prefix: exact {ratio:.1f}x "
          "faster than a cold prefill, "
          f"replay {top['cold'] / top['replay_first']:.1f}x")
    print(f"one state checkpoint {top['state_bytes'] / 2**20:.2f} MiB; one anchor page "
          f"{top['anchor_bytes_per_page'] / 2**10:.1f} KiB")
    args.out.mkdir(parents=True, exist_ok=True)
    name = ("e2e_cpu_quick" if args.quick else "e2e_cpu") + ("_longmem" if args.long_memory else "")
    (args.out / f"{name}.json").write_text(json.dumps(
        {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
         "calibration": [q.__dict__ for qs in gate.measured.values() for q in qs],
         "results": results}, indent=2))
    plot(results, args.out / f"{name}.png")
    print(f"wrote {args.out / (name + '.json')} and {args.out / (name + '.png')}")


if __name__ == "__main__":
    main()
