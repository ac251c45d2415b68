"""The worker half of the harness in its own process, as vLLM runs it: the child builds the
worker-role connector through vLLM's factory and a runner over its own paged buffers; the
parent (vLLM's Scheduler with the scheduler-role connector) sends each ``SchedulerOutput``
over a pipe and gets the ``ModelRunnerOutput`` back (both pickled, as vLLM's multiprocess
executor ships them)."""

from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any


def lose_everything(connector: Any) -> None:
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
          connector: bool, lose: bool, rank: int) -> None:
    sys.path[:0] = paths
    import torch

    torch.set_num_threads(1)  # tiny models: per-op overhead dominates, threads only contend
    import vllm_harness as h
    import vllm_model_runner as mr
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    vc.parallel_config.rank = rank  # what vLLM's WorkerBase sets in each worker
    wc = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg) if connector else None
    if lose and wc is not None:
        lose_everything(wc)
    runner = mr.ModelRunner(cfg, wc, model_dir) if model_dir else h.Runner(cfg, wc, rank=rank)
    while True:
        msg = conn.recv()
        if msg[0] == "step":
            conn.send(runner.step(msg[1]))
        elif msg[0] == "report":
            conn.send({"bad": runner.bad, "computed": runner.computed_tokens,
                       "checked": runner.checked_tokens,
                       "max_err": getattr(runner, "max_err", 0.0),
                       "resumed": getattr(runner, "resumed", 0), "preempted": runner.preempted,
                       "held": _held(wc)})
        else:
            if wc is not None:
                wc.shutdown()
            conn.send("stopped")
            return


def _held(connector: Any | None) -> dict[Any, str]:
    """``{key: tier}`` of what this rank's tiers hold (after its lanes ran)."""
    if connector is None:
        return {}
    ex = connector.worker.worker.executor
    ex.flush()
    return {k: name for name, t in ex.tiers.items() for k in t.held_keys()}


class WorkerProcess:
    """``step(scheduler_output) -> ModelRunnerOutput`` served by a child process."""

    def __init__(self, vc: Any, cfg: Any, model_dir: str | None, connector: bool = True,
                 lose: bool = False, rank: int = 0) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_main, daemon=True, args=(
            child, [p for p in sys.path if p], vc, cfg, model_dir, connector, lose, rank))
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


class TPWorkers:
    """``tp`` worker processes (one per TP rank) behind one ``step``: every rank runs each
    scheduler output, and their outputs are merged by vLLM's own ``KVOutputAggregator``
    (a load counts as done, or failed, only once every rank reported it)."""

    def __init__(self, vc: Any, cfg: Any, tp: int, lose_on: tuple[int, ...] = ()) -> None:
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator

        self.ranks = [WorkerProcess(vc, cfg, None, lose=r in lose_on, rank=r) for r in range(tp)]
        self.aggregator = KVOutputAggregator(tp)

    def step(self, so: Any) -> Any:
        for w in self.ranks:
            w.conn.send(("step", so))
        return self.aggregator.aggregate([w.conn.recv() for w in self.ranks], 0)

    def reports(self) -> list[dict[str, Any]]:
        return [w.report() for w in self.ranks]

    def close(self) -> None:
        for w in self.ranks:
            w.close()
