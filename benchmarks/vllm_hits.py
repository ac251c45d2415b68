"""Hit rate of vLLM's own prefix caching alone vs with HybridConnector, same device budget.

Run: ``.venv/bin/python benchmarks/vllm_hits.py [--quick]`` (CPU, vLLM 0.33.0 from
``scripts/install_engines.sh``).

Both configurations run vLLM 0.33.0's real ``Scheduler`` (align-mode prefix caching for a
tiny Nemotron-H: two Mamba2 groups, one attention group, 32-token blocks) over the same
requests with the same small device KV cache (``--blocks`` blocks per group), through the
CPU harness of ``tests/vllm/`` (its runner checks every KV and state byte a request reads, so
a wrong hit fails the run). Traces (fixed seeds):

* ``multi_turn``: sessions of several turns, turn k's prompt = turn k-1's prompt, its
  output and a new user message; sessions interleave (the device cache cannot hold them all);
* ``branching``: a shared system prompt, several documents, several questions per document
  and follow-ups on some answers (a tree of prefixes); the documents come back in a second
  round, after the device cache has evicted them.

Each with vLLM's ``prefix_cache_retention_interval`` at its default 0 (only "semantic"
boundaries, a prompt's end, are kept and offered to connectors) and dense (every block
boundary kept on device and offered). Reported per run: prompt tokens, hit tokens (vLLM's local hit plus the connector's at
each request's first schedule), token hit rate, tokens recomputed, and the ratios
connector / native. The device budget is what limits vLLM; the connector adds a host tier
(``--host-mb``) with Marconi admission over the boundaries vLLM offers.
Writes ``benchmarks/results/vllm_hits[_quick].json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "vllm")]

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402


class CountingRunner(h.Runner):
    """The harness runner, also counting each request's hit at its first schedule."""

    def __init__(self, cfg: Any, connector: Any | None) -> None:
        super().__init__(cfg, connector)
        self.hit: dict[str, int] = {}
        self.prompt: dict[str, int] = {}

    def step(self, so: Any) -> Any:
        for nr in so.scheduled_new_reqs:
            if nr.req_id not in self.hit:
                self.hit[nr.req_id] = nr.num_computed_tokens
                self.prompt[nr.req_id] = len(nr.prompt_token_ids)
        return super().step(so)


def serve_one(sched: Any, runner: CountingRunner, rid: str, prompt: list[int], out: int) -> list[int]:
    got = h.run(sched, runner, [h.make_request(rid, prompt, out)])
    return got.get(rid, [])


def multi_turn(serve: Any, rng: np.random.Generator, sessions: int, turns: int) -> None:
    system = rng.integers(0, 128, 64).tolist()
    hist = [system + rng.integers(0, 128, 96).tolist() for _ in range(sessions)]
    for t in range(turns):
        for i in range(sessions):
            prompt = hist[i] + rng.integers(0, 128, 24).tolist()
            hist[i] = prompt + serve(f"s{i}t{t}", prompt, 16)


def branching(serve: Any, rng: np.random.Generator, docs: int, questions: int) -> None:
    system = rng.integers(0, 128, 64).tolist()
    texts = [system + rng.integers(0, 128, 160).tolist() for _ in range(docs)]
    k = 0
    for rnd in range(2):  # the documents come back in a second round, evicted on device by then
        for doc in texts:
            for _ in range(questions // (rnd + 1)):
                q = doc + rng.integers(0, 128, 16).tolist()
                ans = serve(f"b{k}", q, 8)
                k += 1
                if k % 2 == 0:  # a follow-up on this answer
                    serve(f"b{k}f", q + ans + rng.integers(0, 128, 12).tolist(), 8)


TRACES = {"multi_turn": multi_turn, "branching": branching}
RETENTIONS = (0, None)  # vLLM's default (semantic boundaries only) and dense (every block)


def _ret(r: int | None) -> str:
    return "dense" if r is None else str(r)


def run_trace(name: str, connector: bool, retention: int | None, envs: dict[Any, dict[str, Any]],
              quick: bool) -> dict[str, Any]:
    env = envs[retention]
    vc = env["vc"]
    if not connector:
        vc = copy.deepcopy(vc)
        vc.kv_transfer_config = None
    sched = h.make_scheduler(vc, env["cfg"])
    worker = None
    if connector:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, env["cfg"])
    runner = CountingRunner(env["cfg"], worker)
    rng = np.random.default_rng(7)

    def serve(rid: str, prompt: list[int], out: int) -> list[int]:
        return serve_one(sched, runner, rid, prompt, out)

    if name == "multi_turn":
        multi_turn(serve, rng, sessions=3 if quick else 5, turns=3 if quick else 4)
    else:
        branching(serve, rng, docs=2 if quick else 4, questions=3 if quick else 4)
    if runner.bad:
        raise AssertionError(f"{name}: wrong bytes read: {runner.bad[:3]}")
    prompt, hit = sum(runner.prompt.values()), sum(runner.hit.values())
    row = {"trace": name, "connector": connector, "retention": retention,
           "requests": len(runner.prompt),
           "prompt_tokens": prompt, "hit_tokens": hit, "token_hit_rate": round(hit / prompt, 4),
           "recomputed_tokens": prompt - hit, "checked_tokens": runner.checked_tokens}
    if connector:
        st = sched.connector.sched.stats
        row.update(connector_hits=st.hits, connector_hit_tokens=st.loaded_tokens,
                   saved=dict(st.saved_objects))
        worker.shutdown()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer sessions and documents")
    ap.add_argument("--blocks", type=int, default=7, help="device KV blocks per group")
    ap.add_argument("--host-mb", type=int, default=16, help="connector host tier (MB)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vllm_hits"))
    y = root / "hybrid.yaml"
    y.write_text(f"chunk_size: 64\nhash_block_size: 32\nalignment: 32\nsave_decode_cache: true\n"
                 f"pools:\n  host: {{kv: {args.host_mb * 2 // 3}MB, state: {args.host_mb // 3}MB}}\n")
    model = s.tiny_nemotron_h(root)
    envs = {}
    for ret in RETENTIONS:
        vc = s.vllm_config(model, y, retention=ret)
        envs[ret] = {"vc": vc, "cfg": s.kv_cache_config(vc, num_blocks=args.blocks)}
    runs = [(t, c, r) for t in TRACES for r in RETENTIONS for c in (False, True)]
    rows = [run_trace(t, c, r, envs, args.quick) for t, c, r in tqdm(runs, desc="runs")]
    print(f"device budget: {envs[0]['cfg'].num_blocks} blocks of {s.BLOCK} tokens; host tier "
          f"{args.host_mb} MB (connector only); retention = vLLM's prefix_cache_retention_interval")
    print("| trace | retention | config | requests | prompt tokens | hit tokens | token hit rate | recomputed |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cfg = "native + HybridConnector" if r["connector"] else "vLLM native (align)"
        print(f"| {r['trace']} | {_ret(r['retention'])} | {cfg} | {r['requests']} | {r['prompt_tokens']} "
              f"| {r['hit_tokens']} | {r['token_hit_rate']:.3f} | {r['recomputed_tokens']} |")
    for t in TRACES:
        for ret in RETENTIONS:
            nat, con = (next(r for r in rows if r["trace"] == t and r["connector"] == c
                             and r["retention"] == ret) for c in (False, True))
            print(f"{t} (retention {_ret(ret)}): hit rate {con['token_hit_rate']:.3f} vs "
                  f"{nat['token_hit_rate']:.3f} native "
                  f"({con['token_hit_rate'] / max(nat['token_hit_rate'], 1e-9):.2f}x); recomputed "
                  f"{con['recomputed_tokens']} vs {nat['recomputed_tokens']} "
                  f"({con['recomputed_tokens'] / max(nat['recomputed_tokens'], 1):.2f}x)")
    out = ROOT / "benchmarks" / "results" / f"vllm_hits{'_quick' if args.quick else ''}"
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out}.json, .png")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    combos = [(c, r) for r in RETENTIONS for c in (False, True)]
    xs = np.arange(len(TRACES))
    w = 0.8 / len(combos)
    for j, (c, ret) in enumerate(combos):
        vals = [next(r["token_hit_rate"] for r in rows if r["trace"] == t and r["connector"] == c
                     and r["retention"] == ret) for t in TRACES]
        name = "native + HybridConnector" if c else "vLLM native"
        ax.bar(xs + (j - (len(combos) - 1) / 2) * w, vals, w, label=f"{name}, retention {_ret(ret)}")
    ax.set_xticks(xs, list(TRACES))
    ax.set_ylabel("token hit rate")
    ax.set_title("vLLM 0.33.0 scheduler, tiny Nemotron-H, same device budget")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
