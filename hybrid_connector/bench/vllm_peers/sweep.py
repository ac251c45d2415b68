"""``hybrid-connector bench vllm-peers``: this project's connector against vLLM's own
offloading connectors, inside vLLM 0.33's real ``Scheduler``, on CPU.

Every peer serves the same traces with the same device blocks and the same host bytes
(``setups``); vLLM's code decides every hit (its scheduler, KV cache manager and
each connector's scheduler side run unchanged); the one stand-in is the workers' GPU copy
routine, a CPU copy (``cpu_copy``). Every byte a hit restores is checked by the
runner (``runner``). The model is a scaled preset (``geometry.scaled``:
Qwen3.5-4B by default, token counts divided by ``divisor`` so vLLM's CPU block is the real
528-token block to scale, 32 tokens), vLLM's prefix caching in align mode with dense
retention (``prefix_cache_retention_interval=None``: every block boundary kept and offered
to connectors).

Traces (``sim.traces_engine`` / ``sim.traces_mooncake``, fixed seeds, lengths divided by
``scale``): chat with regenerations and edits, branching agents, LMCache's multi-round QA,
a Mooncake-format replay. Host budgets are multiples of each trace's live-peak working set
(``sim.working_set``: the clairvoyant peak of KV and states still due a reuse, in this
geometry's bytes). The device cache is ``device_share`` of that working set (at least what
``concurrency`` typical requests need), so vLLM's own prefix cache alone cannot hold it.

Each trace also carries its ``ceiling``: the hit rate, tokens recomputed and modeled time to
first token of an unlimited cache under vLLM's hit rules, which no connector can beat.
Each row also carries a modeled time to first token of the unscaled model on an H200
(``ttft``) and its ratio to the best of vLLM's host-tier connectors at the same budget.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hybrid_connector.bench.vllm_peers import setups as st
from hybrid_connector.bench.vllm_peers import ttft
from hybrid_connector.bench.vllm_peers.ceiling import ceiling
from hybrid_connector.bench.vllm_peers.report import HOST_PEERS

TRACES = ("chat_edits", "agentic_branch", "multiround_qa", "mooncake")


@dataclass(frozen=True)
class PeersConfig:
    """What one invocation runs (``quick`` and ``full`` below)."""

    preset: str = "qwen3.5-4b"
    divisor_near: float = 16.0
    scale: int = 16
    # half the generators' default sizes (their >= 1,000 requests take ~1 h here on 2 cores)
    traces: dict[str, tuple[int, int]] = field(default_factory=lambda: {
        "chat_edits": (64, 8), "agentic_branch": (12, 30), "multiround_qa": (100, 5),
        "mooncake": (300, 6)})
    multiples: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    peers: tuple[str, ...] = st.PEERS
    concurrency: int = 4
    device_share: float = 0.15
    seed: int = 0
    max_out: int = 32  # answers longer than this are cut (decode steps dominate the run time)
    async_scheduling: bool = False  # vLLM's AsyncScheduler, two steps in flight (its GPU default)
    # the engine thread idles this long after each step, as it waits on a GPU's forward pass
    # (the CPU run has none): what a connector's own threads may use (``EngineShape``)
    gpu_step_ms: float = 0.0


def quick() -> PeersConfig:
    """~2 minutes on 2 cores: three small traces, three budgets, two requests at once (so
    the device cache is small next to the traces' working sets)."""
    return PeersConfig(traces={"chat_edits": (32, 6), "agentic_branch": (8, 10),
                               "multiround_qa": (40, 4)},
                       multiples=(0.25, 1.0, 4.0), concurrency=2)


def make_trace(name: str, size: tuple[int, int], seed: int, scale: int) -> list[dict[str, Any]]:
    """The named trace's records (``size``: its generator's two counts)."""
    from hybrid_connector.sim import traces_engine as te
    from hybrid_connector.sim import traces_mooncake as tm

    gen = {"chat_edits": te.chat_edits, "agentic_branch": te.agentic_branch,
           "multiround_qa": te.multiround_qa, "mooncake": tm.mooncake}[name]
    return gen(size[0], size[1], seed=seed, scale=scale)  # type: ignore[operator]


def _device_blocks(records: list[dict[str, Any]], block: int, groups: int, live_tokens: float,
                   cfg: PeersConfig) -> int:
    """Device blocks: ``device_share`` of the trace's live-peak tokens in attention blocks,
    at least what ``concurrency`` requests of the 90th-percentile length need (their
    attention blocks and two running blocks per Mamba/GDN group)."""
    lens = sorted(len(r["input_tokens"]) + min(len(r["output_tokens"]), cfg.max_out)
                  for r in records)
    p90 = lens[int(0.9 * (len(lens) - 1))]
    need = cfg.concurrency * (math.ceil(p90 / block) + 2 * groups) + 4
    share = int(cfg.device_share * live_tokens / block)
    return max(need, share)


def run_sweep(cfg: PeersConfig, *, progress: bool = True, work: Path | None = None,
              configs: Path = Path("configs"), jobs: int = 1) -> dict[str, Any]:
    """Every trace x budget x peer (``none`` once per trace); returns the results document.
    ``work``: where the model config and each trace's rows (``rows-TRACE.jsonl``) go; None:
    a temporary directory, removed at the end.
    ``jobs`` > 1 runs that many traces at once, each in its own process (every run inside
    one trace stays sequential, so one trace's figures never share a process)."""
    from hybrid_connector.bench.vllm_peers import engine as eng
    from hybrid_connector.geometry.scaled import cpu_exact_divisor

    t0 = time.perf_counter()
    made: Path | None = None
    if work is None:
        made = root = Path(tempfile.mkdtemp(prefix="vllm-peers-"))  # removed at the end
    else:
        root = Path(work)
    try:
        divisor = cpu_exact_divisor(cfg.preset, cfg.divisor_near)
        model_dir, sg = eng.write_model(cfg.preset, divisor, root)
        args = [(cfg, t, root, model_dir, configs, progress) for t in cfg.traces]
        if jobs > 1 and len(args) > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(min(jobs, len(args)),
                                     mp_context=mp.get_context("spawn")) as ex:
                done = list(ex.map(_run_trace, args))
        else:
            done = [_run_trace(a) for a in args]
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    geom = sg.geometry
    rows = [r for _, _, rows in done for r in rows]
    ttft.best_vllm_ratios(rows, HOST_PEERS)
    return {
        "benchmark": "vllm-peers", "config": asdict(cfg), "vllm": _vllm_version(),
        "geometry": {"preset": cfg.preset, "divisor": divisor, "block": sg.cpu_block_size(),
                     "kv_bytes_per_token": geom.kv_bytes_per_token(),
                     "state_bytes": geom.state_bytes(), "real_block": sg.real.block_size},
        "traces": {t: info for t, info, _ in done},
        "rows": rows,
        "ttft_model": ttft.for_preset(cfg.preset, divisor).constants(),
        "peers": {n: st.LABELS[n] for n in cfg.peers},
        "vllm_classes": {n: st.VLLM_CLASSES[n] for n in cfg.peers},
        "stand_in": {n: st.STAND_IN.get(n, "none") for n in cfg.peers},
        "wall_s": time.perf_counter() - t0,
    }


def _run_trace(a: tuple[PeersConfig, str, Path, Path, Path, bool]
               ) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """One trace's runs: ``(trace, its figures, its rows)``."""
    import os

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from hybrid_connector.bench.vllm_peers import engine as eng
    from hybrid_connector.bench.vllm_peers.run import EngineShape, run_one
    from hybrid_connector.geometry.scaled import scaled_geometry
    from hybrid_connector.sim.working_set import budget_sweep, trace_stats, working_set_bytes

    cfg, tname, root, model_dir, configs, progress = a
    sg = scaled_geometry(cfg.preset, cpu_exact_divisor_of(cfg))
    block, geom = sg.cpu_block_size(), sg.geometry
    recs = make_trace(tname, cfg.traces[tname], cfg.seed, cfg.scale)
    recs = [dict(r, output_tokens=r["output_tokens"][: cfg.max_out]) for r in recs]
    stats = trace_stats(recs, block)
    ws = working_set_bytes(recs, geom, "live_peak", stats, block)
    vc0 = eng.vllm_config(model_dir, block, connector=None, num_blocks=512, max_len=1024,
                          max_seqs=cfg.concurrency, batched=2048)
    cfg0 = eng.kv_cache_config(vc0, block, 512)
    block_bytes = sum(t.size for t in cfg0.kv_cache_tensors) // 512
    nblocks = _device_blocks(recs, block, len(cfg0.kv_cache_groups), stats["live_peak_tokens"], cfg)
    max_len = max(len(r["input_tokens"]) + len(r["output_tokens"]) for r in recs) + 1
    shape = EngineShape(model_dir, cfg.preset, block, nblocks, max_len, cfg.concurrency,
                        batched=min(2048, cfg.concurrency * max_len),
                        async_scheduling=cfg.async_scheduling,
                        gpu_step_s=cfg.gpu_step_ms / 1e3)
    info = {"requests": len(recs), "prompt_tokens": int(sum(len(r["input_tokens"]) for r in recs)),
            "working_set_bytes": ws, "device_blocks": nblocks,
            "device_bytes": nblocks * block_bytes, "max_len": max_len,
            "reusable_share": stats["reusable_share"]}
    model = ttft.for_preset(cfg.preset, sg.divisor)
    info["ceiling"] = ceiling(recs, block, model)
    rows: list[dict[str, Any]] = []
    # every block of the trace once: more than any disk tier can be given to write
    every_block = sum(math.ceil((len(r["input_tokens"]) + len(r["output_tokens"])) / block)
                      for r in recs) * block_bytes
    order = sorted(cfg.peers, key=lambda n: n == "ours-nvme")  # after offload-fs (its budget)
    for m, budget in budget_sweep(ws, cfg.multiples).items():
        fs_held: int | None = None
        for name in order:
            if name == "none" and m != cfg.multiples[0]:
                continue  # no connector: the budget does not matter
            disk = (fs_held or every_block) if name == "ours-nvme" else None
            p = st.peer(name, budget, preset=cfg.preset, block=block, work=root, configs=configs,
                        disk_budget=disk, load_gate=model.load_gate())
            r = run_one(shape, p, recs)
            if name == "offload-fs":
                fs_held = r["disk_peak_bytes"]
            if disk is not None:
                r["disk_budget"] = disk
                r["disk_budget_from"] = "offload-fs" if fs_held else "every block of the trace"
            per = r.pop("per_request")  # (prompt, hit, external) tokens per request
            r.update(trace=tname, multiple=m if name != "none" else None,
                     ttft=model.summary(per, r["loaded_bytes"],
                                        disk_bytes=r.get("disk_loaded_bytes", 0)))
            rows.append(r)
            # a partial sweep is kept; the work files also keep each request's hit
            with (root / f"rows-{tname}.jsonl").open("a") as f:
                f.write(json.dumps({**r, "per_request": per}, default=str) + "\n")
            if progress:
                what = "any budget" if name == "none" else f"{m:g}x"
                print(f"  {tname:15s} {what:>10s} {st.LABELS[name]:28s} hit rate "
                      f"{r['hit_rate']:.3f}  modeled TTFT {r['ttft']['mean_ms']:.0f} ms  "
                      f"sched {r['sched_ms_mean']:.2f} ms/step  "
                      f"({r['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    return tname, info, rows


def cpu_exact_divisor_of(cfg: PeersConfig) -> float:
    """The divisor at which the preset's real block is a CPU block (``cpu_exact_divisor``)."""
    from hybrid_connector.geometry.scaled import cpu_exact_divisor

    return cpu_exact_divisor(cfg.preset, cfg.divisor_near)


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)
