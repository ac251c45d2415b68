"""The worker half of the harness in its own process, as vLLM runs it: the child builds the
worker-role connector through vLLM's factory and a runner over its own paged buffers; the
parent (vLLM's Scheduler with the scheduler-role connector) sends each ``SchedulerOutput``
over a pipe and gets the ``ModelRunnerOutput`` back (both pickled, as vLLM's multiprocess
executor ships them)."""

from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any


def _lose_everything(connector: Any) -> None:
    """Every object vanishes from this rank's tiers right after it is stored (a load fault)."""
    ex = connector.worker.worker.executor
    orig = ex.submit

    def submit(ops, payloads, **kw):  # type: ignore[no-untyped-def]
        def done(indices, results):  # type: ignore[no-untyped-def]
            for t in ex.tiers.values():
                t.remove(list(t.held_keys()))
            kw["done"](indices, results)
        return orig(ops, payloads, **{**kw, "done": done})

    ex.submit = submit


def _main(conn: Any, paths: list[str], vc: Any, cfg: Any, model_dir: str | None,
          connector: bool, lose: bool) -> None:
    sys.path[:0] = paths
    import torch

    torch.set_num_threads(1)  # tiny models: per-op overhead dominates, threads only contend
    import vllm_harness as h
    import vllm_model_runner as mr
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    wc = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg) if connector else None
    if lose and wc is not None:
        _lose_everything(wc)
    runner = mr.ModelRunner(cfg, wc, model_dir) if model_dir else h.Runner(cfg, wc)
    while True:
        msg = conn.recv()
        if msg[0] == "step":
            conn.send(runner.step(msg[1]))
        elif msg[0] == "report":
            conn.send({"bad": runner.bad, "computed": runner.computed_tokens,
                       "checked": runner.checked_tokens,
                       "max_err": getattr(runner, "max_err", 0.0),
                       "resumed": getattr(runner, "resumed", 0), "preempted": runner.preempted})
        else:
            if wc is not None:
                wc.shutdown()
            conn.send("stopped")
            return


class WorkerProcess:
    """``step(scheduler_output) -> ModelRunnerOutput`` served by a child process."""

    def __init__(self, vc: Any, cfg: Any, model_dir: str | None, connector: bool = True,
                 lose: bool = False) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_main, daemon=True, args=(
            child, [p for p in sys.path if p], vc, cfg, model_dir, connector, lose))
        self.proc.start()

    def step(self, so: Any) -> Any:
        self.conn.send(("step", so))
        return self.conn.recv()

    def report(self) -> dict[str, Any]:
        self.conn.send(("report",))
        return self.conn.recv()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.conn.send(("stop",))
        self.conn.recv()
        self.proc.join(timeout=30)
