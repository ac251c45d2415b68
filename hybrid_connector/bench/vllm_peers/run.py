"""One head-to-head run: a trace served by vLLM's ``Scheduler`` with one connector.

Requests arrive closed-loop in trace order: up to ``concurrency`` run at once, and a
request waits while an earlier request of its session is still running (its prompt holds
that request's answer). Each request asks for its recorded answer's length and samples the
recorded tokens (``runner``). After each engine step ours waits for its worker's tier ops
(``WorkerSide.flush``), as the peers' stand-ins finish every job in the step that issued
it, and its worker reports them in the next step (``StepReports``: never in the step that
issued them, whether or not a fast thread ran them before the worker's report), so a run
does not depend on thread speed and repeats exactly. Measured per run:

* ``hit_tokens``: per request, ``num_computed_tokens`` when vLLM first schedules it (vLLM's
  local prefix hit plus the connector's external hit, as vLLM's scheduler decided them);
  ``vllm_hits`` cross-checks with vLLM's own ``SchedulerStats`` (prefix cache plus connector
  prefix cache hits);
* ``recomputed``: prompt tokens the runner computed (a preempted request computed again
  counts again);
* ``sched_ms``: ``schedule()`` + ``update_from_output()`` per step, CPU time of the engine
  thread; ``sched_wall_ms`` the same calls' wall time (with it, waits for the interpreter
  lock a connector's own threads hold);
* ``held_bytes``: host bytes the connector holds at the end, and the peak seen at every
  ``probe_every`` steps;
* ``loaded_bytes`` / ``stored_bytes``: bytes the connector copied into vLLM's blocks and out
  of them to its host tier (vLLM's connectors: the stand-in copy's counters; ours: its own
  ``loaded_bytes`` / ``saved_bytes`` as vLLM's ``SchedulerStats`` carry them);
* ``per_request``: (prompt, hit, external hit) tokens per request, the external part from
  vLLM's ``PrefillStats`` (what ``ttft`` models the time to first token from), and
  ``external_hit_tokens`` their sum (the hit tokens the connector served);
* the host + disk peers (``disk_run``): ``held_bytes`` / ``peak_bytes`` count the host tier
  only, and ``disk_held_bytes``, ``disk_peak_bytes``, ``disk_file_bytes``,
  ``disk_loaded_bytes`` (bytes a disk tier served into vLLM's blocks) come with them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hybrid_connector.bench.vllm_peers import engine as eng
from hybrid_connector.bench.vllm_peers import setups as st
from hybrid_connector.bench.vllm_peers.disk_run import SETTLE_TIMEOUT_S, DiskRun
from hybrid_connector.bench.vllm_peers.step_queue import StepQueue


@dataclass(frozen=True)
class EngineShape:
    """The engine every peer runs under: model, block, device blocks, batch limits."""

    model_dir: Path
    preset: str
    block: int
    num_blocks: int
    max_len: int
    concurrency: int
    batched: int
    async_scheduling: bool = False  # ``engine.make_scheduler``; driven as vLLM's batch queue
    # after each step the engine thread sleeps this long (interpreter lock released), as
    # vLLM's engine core waits on the GPU's forward pass: a connector's threads (ours: the
    # bounded auto-alpha tuner) get that time. 0: steps back to back, as a CPU run is
    gpu_step_s: float = 0.0


class RunError(RuntimeError):
    """A run that did not finish or read a wrong byte."""


@dataclass
class _Tally:
    """What vLLM hands back per step: its prefix-hit counters (local and connector), each
    request's external hit at its first schedule (``PrefillStats``) and the connector's
    byte counters (``kv_connector_stats``, those our connector reports)."""

    vllm_hits: int = 0
    external: dict[str, int] = field(default_factory=dict)
    conn: dict[str, int] = field(default_factory=dict)

    def take(self, eco: dict[int, Any]) -> None:
        for e in eco.values():
            s = e.scheduler_stats
            if s is not None:
                self.vllm_hits += s.prefix_cache_stats.hits
                if s.connector_prefix_cache_stats is not None:
                    self.vllm_hits += s.connector_prefix_cache_stats.hits
                for k, v in (s.kv_connector_stats or {}).items():
                    if k in ("loaded_bytes", "saved_bytes"):
                        self.conn[k] = self.conn.get(k, 0) + int(v)
            for o in e.outputs:
                if o.prefill_stats is not None:
                    self.external.setdefault(o.request_id, o.prefill_stats.num_external_cached_tokens)


def run_one(shape: EngineShape, p: st.Peer, records: list[dict[str, Any]],
            probe_every: int = 50, max_steps: int = 400_000) -> dict[str, Any]:
    """Serve ``records`` through vLLM's Scheduler with peer ``p`` (module docstring)."""
    from hybrid_connector.bench.vllm_peers import buffers as vb
    from hybrid_connector.bench.vllm_peers.runner import Runner

    t_start = time.perf_counter()
    vc = eng.vllm_config(shape.model_dir, shape.block, connector=p.transfer,
                         num_blocks=shape.num_blocks, max_len=shape.max_len,
                         max_seqs=shape.concurrency, batched=shape.batched)
    cfg = eng.kv_cache_config(vc, shape.block, shape.num_blocks)
    bufs = eng.allocate(cfg)
    worker = None
    disk = DiskRun(p.name, p.transfer) if p.name in st.DISK_PEERS and p.transfer else None
    if p.transfer is not None:
        worker = eng.make_worker(vc, cfg)
        if disk is not None:
            disk.install(worker)
        else:
            st.install_stand_in(p.name, worker)
        vb.bind_backend(vc, cfg, vb.backend_class(eng.BACKEND))
    sched = None
    try:
        runner = Runner(cfg, bufs, worker, shape.block, eng.BACKEND)
        if p.name == "simple" and worker is not None:  # the engine core hands the workers' block count to the scheduler
            vc.cache_config.simple_cpu_offload_num_blocks = worker.worker_handler.num_cpu_blocks
        sched = eng.make_scheduler(vc, cfg, shape.block, shape.async_scheduling)
        if disk is not None:
            disk.attach(sched, worker)
        out = _drive(shape, p, sched, runner, worker, records, probe_every, max_steps, disk)
    finally:
        for c in (getattr(sched, "connector", None), worker):
            if c is not None:
                c.shutdown()
        if disk is not None:
            closed = disk.close()
    if disk is not None:
        out.update(closed)
    if runner.bad:
        raise RunError(f"{p.name}: wrong bytes read: {runner.bad[:3]}")
    out["wall_s"] = time.perf_counter() - t_start
    return out


def _drive(shape: EngineShape, p: st.Peer, sched: Any, runner: Any, worker: Any,
           records: list[dict[str, Any]], probe_every: int, max_steps: int,
           disk: DiskRun | None = None) -> dict[str, Any]:
    def held_now() -> int:
        return (disk.host_bytes(sched, worker) if disk is not None
                else st.held_bytes(p.name, sched, worker))

    reports = StepReports(worker.worker) if p.name.startswith("ours") and worker is not None else None

    def settle() -> None:
        if disk is not None:
            disk.after_step()  # vLLM's fs tier threads
        if reports is not None:
            # our tier ops run on the executor's threads; wait for them so that a run does
            # not depend on their speed (the peers' stand-ins finish every job in its step)
            reports.settle()

    pending: deque[tuple[str, list[int], int]] = deque()
    session_of: dict[str, str] = {}
    prompts: dict[str, int] = {}
    for i, r in enumerate(records):
        rid = f"q{i}"
        prompt = [int(x) for x in r["input_tokens"]][: shape.max_len - 1]
        answer = [int(x) for x in r["output_tokens"]][: max(1, shape.max_len - len(prompt))]
        runner.outputs[rid] = answer
        session_of[rid] = str(r["session_id"])
        prompts[rid] = len(prompt)
        pending.append((rid, prompt, len(answer)))
    busy: set[str] = set()
    running = 0
    step_ms: list[float] = []
    wall_ms: list[float] = []
    tally = _Tally()
    peak = 0
    steps = 0
    inflight = StepQueue(sched, runner, shape.async_scheduling)  # EngineCore's order of steps
    sched_s = wall_s = 0.0

    def schedule() -> Any:
        # CPU time of this thread (vLLM's engine-core thread): other processes on a shared
        # machine (--jobs) do not count, nor the connectors' own I/O threads
        nonlocal sched_s, wall_s
        t0, w0 = time.thread_time(), time.perf_counter()
        so = sched.schedule()
        sched_s += time.thread_time() - t0
        wall_s += time.perf_counter() - w0
        return so

    while pending or sched.has_unfinished_requests() or inflight:
        while pending and running < shape.concurrency and session_of[pending[0][0]] not in busy:
            rid, prompt, n_out = pending.popleft()
            if shape.async_scheduling:  # ends at its last token as at an end-of-turn token
                last = runner.outputs[rid][-1:]
                req = eng.make_request(rid, prompt, n_out + 1, shape.block, last, n_out)
            else:
                req = eng.make_request(rid, prompt, n_out, shape.block)
            sched.add_request(req)
            busy.add(session_of[rid])
            running += 1
        due = inflight.step(schedule)
        if due is None:
            if inflight:
                continue  # the batch queue fills
            raise RunError(f"{p.name}: requests pending but nothing to schedule")
        t2, w2 = time.thread_time(), time.perf_counter()
        eco = sched.update_from_output(*due)
        step_ms.append((time.thread_time() - t2 + sched_s) * 1e3)
        wall_ms.append((time.perf_counter() - w2 + wall_s) * 1e3)
        sched_s = wall_s = 0.0
        settle()
        if shape.gpu_step_s:
            time.sleep(shape.gpu_step_s)
        tally.take(eco)
        for e in eco.values():
            for o in e.outputs:
                if o.finish_reason is not None:
                    busy.discard(session_of[o.request_id])
                    running -= 1
        steps += 1
        if steps % probe_every == 0:
            peak = max(peak, held_now())
            if disk is not None:
                disk.probe(worker)
        if steps > max_steps:
            raise RunError(f"{p.name}: not finished after {max_steps} steps")
    for _ in range(3):  # the last saves' reports come back
        for due in inflight.drain():
            tally.take(sched.update_from_output(*due))
        so = sched.schedule()
        tally.take(sched.update_from_output(so, runner.step(so)))
        settle()
    if p.name.startswith("ours"):
        _settle(sched, runner, tally, settle)
    held_b = held_now()
    s_loaded, s_stored = st.moved_bytes(p.name, worker)  # (0, 0) for ours: its own counters
    loaded, stored = ((tally.conn.get("loaded_bytes", 0), tally.conn.get("saved_bytes", 0))
                      if p.name.startswith("ours") else (s_loaded, s_stored))
    prompt_total = sum(prompts.values())
    hit_of = {r: min(runner.first_hit.get(r, 0), prompts[r]) for r in prompts}
    hits = sum(hit_of.values())
    detail = [(prompts[r], hit_of[r], min(tally.external.get(r, 0), hit_of[r])) for r in prompts]
    ms, wms = np.asarray(step_ms), np.asarray(wall_ms)
    return {
        "peer": p.name, "budget": p.budget, "requests": len(records), "steps": steps,
        "prompt_tokens": prompt_total, "hit_tokens": hits, "vllm_hits": int(tally.vllm_hits),
        "hit_rate": hits / prompt_total if prompt_total else 0.0,
        "recomputed": int(runner.computed_prompt_tokens),
        "held_bytes": held_b, "peak_bytes": max(peak, held_b),
        "bytes_per_hit_token": max(peak, held_b) / hits if hits else None,
        "loaded_bytes": int(loaded), "stored_bytes": int(stored),
        "stored_bytes_per_hit_token": stored / hits if hits else None,
        "sched_ms_mean": float(ms.mean()), "sched_ms_p50": float(np.percentile(ms, 50)),
        "sched_ms_p99": float(np.percentile(ms, 99)),
        "sched_wall_ms_mean": float(wms.mean()), "sched_wall_ms_p99": float(np.percentile(wms, 99)),
        "checked_tokens": int(runner.checked_tokens), "preempted": int(runner.preempted),
        "standin_loaded_bytes": s_loaded, "standin_stored_bytes": s_stored,
        "external_hit_tokens": sum(e for _, _, e in detail), "per_request": detail,
        **_ours_stats(p.name, sched),
        **(disk.finish(worker) if disk is not None else {}),
    }


class StepReports:
    """Our worker's op reports, handed to vLLM one step after the step that issued the ops.
    ``WorkerSide.take_reports`` returns what the tier threads finished so far, and the
    worker takes it right after the step's saves are queued: a thread that ran a save
    before that had it reach the index a step earlier than a slower one, so later lookups
    saw other objects (repeats of the quick differed by up to 1% in hit tokens). Here the
    worker takes exactly the reports collected at the end of the previous step (``settle``:
    after every op submitted so far has run)."""

    def __init__(self, side: Any) -> None:
        self.side = side
        self._take = side.take_reports
        self.ready: list[Any] = []
        side.take_reports = self.take

    def take(self) -> list[Any]:
        out, self.ready = self.ready, []
        return out

    def settle(self) -> None:
        self.side.flush(SETTLE_TIMEOUT_S)
        self.ready.extend(self._take())


def _settle(sched: Any, runner: Any, tally: _Tally, settle: Callable[[], None],
            deadline_s: float = 30.0) -> None:
    """Step the idle engine until our connector's in-flight saves are reported (they come
    back a step or more after the copy)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        so = sched.schedule()
        tally.take(sched.update_from_output(so, runner.step(so)))
        settle()
        if not sched.requests:
            return


def _ours_stats(name: str, sched: Any) -> dict[str, Any]:
    """Our connector's own counters (hits, loaded tokens, failed loads)."""
    if not name.startswith("ours"):
        return {}
    s = sched.connector.sched.stats
    tuner = getattr(sched.connector.sched.index.eviction, "tuner", None)
    return {"tuner_skipped": getattr(tuner, "skipped", None),
            "ours": {"lookups": int(s.lookups), "hits": int(s.hits), "hit_tokens": int(s.hit_tokens),
                     "loads": int(s.loads), "loaded_tokens": int(s.loaded_tokens),
                     "failed_loads": int(s.failed_loads),
                     "hits_without_state": int(s.hits_without_state),
                     "saved_objects": dict(s.saved_objects)}}
