"""Replay quality on a real transformers model: restore+replay vs full prefill.

:func:`measure_replay` prefills ``tokens[:p]`` once (capturing anchors and the KV), then for
each budget k rebuilds the recurrent state at p from the last k anchors
(:func:`hybrid_connector.integrations.hf.replay.replay_states`), runs ``tokens[p:]`` and compares with the
full prefill: KL(full || replay) of the next-token distribution at every suffix position,
top-1 agreement there, and a greedy continuation of ``continuation`` tokens (fraction
identical up to the first divergence). :func:`calibrate_gate` records such measurements in
a :class:`~hybrid_connector.runtime.suffix_replay.ReplayGate`.

``python -m hybrid_connector.integrations.hf.quality`` prints the sweep for the tiny
configs, with random-init decay and with long-memory decay (see ``long_memory_``).
``--trained`` sweeps k and the anchor density rho on the shipped trained Qwen3.5 model
(:mod:`hybrid_connector.integrations.hf.trained`) and on the same architecture with random
weights, over held-out stdlib text, calibrates a gate per rho from the trained figures and
writes ``replay_quality_trained.{json,md,png}`` (:mod:`hybrid_connector.integrations.hf.quality_report`).
``--trained --arch nemotron_h`` does the same for the shipped trained Nemotron-H (Mamba2) and
writes ``replay_quality_trained_nemotron_h.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from hybrid_connector.integrations.hf.anchors import AnchorRecorder
from hybrid_connector.integrations.hf.replay import gather_anchors, refuse_replay, replay_states
from hybrid_connector.integrations.hf.state import new_model_cache
from hybrid_connector.runtime.suffix_replay import ReplayGate, ReplayQuality, next_token_kl

if TYPE_CHECKING:
    from hybrid_connector.integrations.hf.runtime import HFRuntime


@torch.no_grad()
def _greedy(rt: HFRuntime, mc: Any, last: torch.Tensor, start: int, n: int) -> list[int]:
    out = []
    logits = last
    for i in range(n):
        tok = int(torch.argmax(logits))
        out.append(tok)
        if i + 1 < n:
            logits = rt.run_tokens(torch.tensor([tok]), mc, start + i, all_logits=False)[-1]
    return out


@torch.no_grad()
def measure_replay(rt: HFRuntime, tokens: Sequence[int], p: int, ks: Sequence[int],
                   continuation: int = 32) -> list[ReplayQuality]:
    """Quality of replaying the last k anchors before p, for each k in ``ks``.

    ``p`` must be a multiple of the anchor page and ``0 < p < len(tokens)``. Uses the
    runtime's model, adapter and anchor layout; leaves its HybridCache untouched.
    """
    refuse_replay(rt.model)
    ids = torch.as_tensor(list(tokens), dtype=torch.long)
    n, page = int(ids.numel()), rt.layout.page
    if not 0 < p < n or p % page:
        raise ValueError(f"p={p} must be a multiple of the anchor page {page} in (0, {n})")
    own = rt.recorder
    rec = AnchorRecorder(rt.model, rt.layout).attach()
    rt.recorder = rec
    try:
        mc = new_model_cache(rt.model)
        rt.run_tokens(ids[:p], mc, 0, all_logits=False)
        pages = rec.pages(p)
        rec.start_at(0, enabled=False)
        kv = rt.adapter.extract_kv(mc, 0, p) if rt.adapter.attention else None
        ref = rt.run_tokens(ids[p:], mc, p)
        ref_cont = _greedy(rt, mc, ref[-1], n, continuation)
        hidden, pos = gather_anchors(rt.layout, [it.payload for it in pages], [it.start for it in pages])
        out = []
        for k in ks:
            test = rt.adapter.restore([kv] if kv is not None else [], [(0, p)] if kv is not None else [],
                                      p, None)
            rt.adapter.set_states(test, replay_states(rt.model, rt.adapter, rt.layout, hidden, pos, k))
            got = rt.run_tokens(ids[p:], test, p)
            cont = _greedy(rt, test, got[-1], n, continuation)
            kl = next_token_kl(ref, got)
            same = next((i for i, (a, b) in enumerate(zip(ref_cont, cont, strict=True)) if a != b),
                        continuation)
            out.append(ReplayQuality(
                k=min(k, int(pos.numel())), kl_mean=float(kl.mean()), kl_max=float(kl.max()),
                top1=float((ref.argmax(-1) == got.argmax(-1)).float().mean()),
                continuation=same / continuation if continuation else 1.0,
                continuation_len=continuation))
        return out
    finally:
        rec.detach()
        rt.recorder = own


def calibrate_gate(rt: HFRuntime, gate: ReplayGate, prompts: Sequence[Sequence[int]],
                   positions: Sequence[int], ks: Sequence[int], continuation: int = 32) -> ReplayGate:
    """Measure every (prompt, p, k) and record it in ``gate`` (mutated, returned)."""
    for tokens in prompts:
        for p in positions:
            for q in measure_replay(rt, tokens, p, ks, continuation):
                gate.record(q)
    return gate


def sweep_trained(ks: Sequence[int], rhos: Sequence[float], p: int = 192, tokens: int = 256,
                  n_prompts: int = 4, page: int = 16, continuation: int = 16,
                  models: Sequence[str] = ("trained", "random"),
                  arch: str = "qwen3_5") -> list[dict[str, Any]]:
    """Replay quality of the shipped trained ``arch`` model and of the same architecture with random
    weights (seed 0), on ``n_prompts`` disjoint held-out stdlib windows of ``tokens`` bytes,
    for every anchor density rho and anchor budget k. One row per (model, rho, k): the means
    over prompts of KL mean, KL max (max over prompts), top-1 and greedy agreement, with the
    tokens the k anchors span (p minus the first replayed anchor's position) and the per-prompt :class:`ReplayQuality` list."""
    from hybrid_connector.core.config import load_config
    from hybrid_connector.core.keys import ObjectKind
    from hybrid_connector.integrations.hf.runtime import HFRuntime
    from hybrid_connector.integrations.hf.trained import corpus_tokens, load_trained_model
    from hybrid_connector.tiers.memory import MemoryStore

    held = corpus_tokens("heldout", limit=tokens * n_prompts)
    prompts = [held[i * tokens:(i + 1) * tokens].tolist() for i in range(n_prompts)]
    rows: list[dict[str, Any]] = []
    for name in models:
        model = load_trained_model(arch=arch)
        if name == "random":
            torch.manual_seed(0)
            model = type(model)(model.config).eval()
        for rho in rhos:
            conf = load_config(overrides={"anchor_page_size": page, "anchor_density": rho,
                                          "chunk_size": 64, "alignment": 1}, environ={})
            rt = HFRuntime.create(model, conf, MemoryStore({k: 1 << 30 for k in ObjectKind}),
                                  anchors=False)
            kept = [q for start in range(0, p, page) for q in rt.layout.positions(start)]
            per_k: dict[int, list[ReplayQuality]] = {k: [] for k in ks}
            for toks in prompts:
                for k, q in zip(ks, measure_replay(rt, toks, p, ks, continuation), strict=True):
                    per_k[k].append(q)
            for k, qs in per_k.items():
                rows.append({
                    "model": name, "rho": rho, "k": k, "k_used": qs[0].k,
                    "span_tokens": p - int(kept[-qs[0].k]),
                    "kl_mean": sum(q.kl_mean for q in qs) / len(qs),
                    "kl_max": max(q.kl_max for q in qs),
                    "top1": sum(q.top1 for q in qs) / len(qs),
                    "greedy": sum(q.continuation for q in qs) / len(qs),
                    "per_prompt": [asdict(q) for q in qs]})
            print(f"{name} rho={rho}: " + " ".join(
                f"k={r['k']}:{r['top1']:.3f}" for r in rows if r["model"] == name and r["rho"] == rho))
    return rows


# --------------------------------------------------------------------------- test models


@torch.no_grad()
def long_memory_(model: Any, decay_per_token: float = 0.9975) -> Any:
    """Make every recurrent layer of a random-weight model remember hundreds of tokens
    (in place; returns the model). Random init forgets within a few tokens (Mamba A in
    [1, 16], GDN erase gate beta ~ 0.5), which would make replay look perfect.

    Sets A = -exp(A_log) and the dt bias so that exp(A * softplus(dt_bias)) is about
    ``decay_per_token``; for Gated DeltaNet also biases the erase gate beta = sigmoid(b) to
    about 0.02 (the b projection, Qwen3.5's ``in_proj_b`` or the b rows of Qwen3-Next's
    fused ``in_proj_ba``, gets a bias of -4)."""
    dt = 0.125
    a = -math.log(decay_per_token) / dt
    dt_raw = math.log(math.expm1(dt))  # softplus^-1
    for mod in model.modules():
        a_log = getattr(mod, "A_log", None)
        if isinstance(a_log, torch.nn.Parameter):
            a_log.fill_(math.log(a))
            bias = getattr(mod, "dt_bias", None)
            if isinstance(bias, torch.nn.Parameter):
                bias.fill_(dt_raw)
            dt_proj = getattr(mod, "dt_proj", None)
            if isinstance(dt_proj, torch.nn.Linear) and dt_proj.bias is not None:
                dt_proj.bias.fill_(dt_raw)
                dt_proj.weight.mul_(0.1)
            in_b = getattr(mod, "in_proj_b", None)
            if isinstance(in_b, torch.nn.Linear) and in_b.bias is None:  # Qwen3.5
                mod.in_proj_b = _biased(in_b, torch.ones(in_b.out_features, dtype=torch.bool))
            in_ba = getattr(mod, "in_proj_ba", None)
            if isinstance(in_ba, torch.nn.Linear) and in_ba.bias is None:  # Qwen3-Next
                # Output viewed as [k_heads, 2 * r] (r = v_heads / k_heads): b then a per group.
                r = int(mod.num_v_heads) // int(mod.num_k_heads)
                rows = (torch.arange(in_ba.out_features) % (2 * r)) < r
                mod.in_proj_ba = _biased(in_ba, rows)
    return model


def _biased(lin: torch.nn.Linear, rows: torch.Tensor) -> torch.nn.Linear:
    """A copy of ``lin`` with a bias of -4 (and weights x0.1) on the erase-gate ``rows``:
    beta = sigmoid(b) ~ 0.02 instead of ~0.5."""
    new = torch.nn.Linear(lin.in_features, lin.out_features, bias=True,
                          dtype=lin.weight.dtype, device=lin.weight.device)
    new.weight.copy_(lin.weight)
    new.weight[rows] *= 0.1
    new.bias.zero_()
    new.bias[rows] = -4.0
    return new


def _main() -> None:
    from transformers import AutoModelForCausalLM

    from hybrid_connector.core.config import load_config
    from hybrid_connector.core.keys import ObjectKind
    from hybrid_connector.geometry.presets import TINY_ARCHS, tiny_hf_config
    from hybrid_connector.integrations.hf.runtime import HFRuntime
    from hybrid_connector.tiers.memory import MemoryStore

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", nargs="*", default=list(TINY_ARCHS))
    ap.add_argument("--tokens", type=int, help="prompt length (448; --trained: 256)")
    ap.add_argument("--p", type=int, help="restore position (384; --trained: 192)")
    ap.add_argument("--page", type=int, help="anchor page (16; --trained: 64)")
    ap.add_argument("--density", type=float, default=1.0)
    ap.add_argument("--ks", type=int, nargs="*",
                    help="anchor budgets (8 32 128 384; --trained: 1 2 4 8 16 32 64 128 192)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init-std", type=float, default=0.02,
                    help="initializer_range of the random weights (larger: peakier logits)")
    ap.add_argument("--trained", action="store_true",
                    help="sweep k and rho on the shipped trained model (and random weights)")
    ap.add_argument("--arch", default="qwen3_5", help="--trained: qwen3_5 or nemotron_h")
    ap.add_argument("--rhos", type=float, nargs="*", default=[1.0, 0.5, 0.25])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.trained:
        from hybrid_connector.integrations.hf.quality_report import write_report

        tokens, p, page = args.tokens or 256, args.p or 192, args.page or 64
        rows = sweep_trained(args.ks or [1, 2, 4, 8, 16, 32, 64, 128, 192], args.rhos, p, tokens,
                             args.prompts, page, arch=args.arch)
        print(write_report(rows, args.out, p=p, tokens=tokens, page=page, arch=args.arch))
        return
    args.tokens, args.p, args.page = args.tokens or 448, args.p or 384, args.page or 16
    args.ks = args.ks or [8, 32, 128, 384]
    conf = load_config(overrides={"anchor_page_size": args.page, "anchor_density": args.density,
                                  "chunk_size": 64, "alignment": 1}, environ={})
    print(f"tokens={args.tokens} p={args.p} page={args.page} rho={args.density} "
          f"init_std={args.init_std}")
    print(f"{'arch':18s} {'memory':8s} {'k':>5s} {'KL mean':>10s} {'KL max':>10s} {'top1':>6s} {'cont32':>6s}")
    for arch in args.archs:
        for memory in ("random", "long"):
            torch.manual_seed(0)
            cfg = tiny_hf_config(arch, initializer_range=args.init_std)
            model = AutoModelForCausalLM.from_config(cfg).eval()
            if memory == "long":
                long_memory_(model)
            rt = HFRuntime.create(model, conf, MemoryStore({k: 1 << 30 for k in ObjectKind}),
                                  anchors=False)
            g = torch.Generator().manual_seed(1)
            toks = torch.randint(0, model.config.get_text_config().vocab_size, (args.tokens,), generator=g).tolist()
            for q in measure_replay(rt, toks, args.p, args.ks):
                print(f"{arch:18s} {memory:8s} {q.k:5d} {q.kl_mean:10.2e} {q.kl_max:10.2e} "
                      f"{q.top1:6.3f} {q.continuation:6.3f}")


if __name__ == "__main__":
    _main()
