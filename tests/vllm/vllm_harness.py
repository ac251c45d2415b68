"""vLLM's own ``Scheduler`` driving our connector on CPU, with a runner that executes each
``SchedulerOutput`` on paged buffers the way vLLM's GPU model runner does in align mode.

The runner's "model" is a deterministic function of the token prefix and the request's
LoRA adapter (so every byte a request reads can be checked): the KV of position t is
``kv_value(adapter, tokens[:t + 1])`` and the recurrent state after t tokens is
``state_value(adapter, tokens[:t])``. Before computing a step it
checks what a model would read: KV of ``[0, computed)`` in the request's attention blocks
and the state in block ``(computed - 1) // block_size`` of every Mamba group (the block
``preprocess_mamba`` copies forward); after it, it writes the new KV and the new state into
block ``cdiv(computed + scheduled, block_size) - 1`` (align mode's running block). A wrong
or stale byte loaded by the connector fails the check, whatever the sampled tokens.

This is the scheduler-and-bytes half of the end-to-end harness; the transformers model
runner (real logits) is the other half (issue 11, still open).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import vllm_buffers as vb
import vllm_support as s
from vllm_support import BACKEND, BLOCK, LAYOUT, allocate

from hybrid_connector.bench.vllm_peers import engine as eng
from hybrid_connector.bench.vllm_peers.mixin_order import after_forward, before_forward
from hybrid_connector.bench.vllm_peers.prefix_hash import prefix_hash
from hybrid_connector.bench.vllm_peers.run import StepReports
from hybrid_connector.bench.vllm_peers.sched_output import apply_scheduler_output
from hybrid_connector.bench.vllm_peers.step_queue import StepQueue


def _digest(h: bytes, tag: bytes, n: int) -> torch.Tensor:
    raw = hashlib.shake_256(h + tag).digest(n)
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.float32))


def _adapter(nr: Any) -> bytes:
    """The seed of a request's hash chain: its LoRA adapter's name (b"" for none), so an
    adapter's KV and states differ from the base model's for the same tokens, as they do."""
    lora = nr.lora_request
    return lora.lora_name.encode() if lora is not None else b""


@dataclass
class Req:
    tokens: list[int]
    block_ids: list[list[int]]
    computed: int = 0
    verified: bool = False
    chain: list[bytes] = field(default_factory=lambda: [b""])  # chain[t]: hash of tokens[:t]

    def h(self, t: int) -> bytes:
        return prefix_hash(self.chain, self.tokens, t)

    def resumed(self) -> None:
        """After a preemption (new block table and tokens from vLLM)."""
        self.verified = False


class Runner:
    """Executes scheduler outputs on paged buffers (see the module docstring): vLLM's own
    allocation for ``backend`` in ``layout`` (``cfg`` planned under that layout), read and
    written the way the backend and the Mamba layers read them (``kv[name]``: (K, V) of
    ``[blocks, block_size, heads, head_size]``; ``states[name]``: the state tensors)."""

    def __init__(self, cfg: Any, connector: Any | None, vocab: int = 128, rank: int = 0,
                 backend: str = BACKEND, layout: str = LAYOUT) -> None:
        from vllm.v1.kv_cache_interface import MambaSpec

        self.cfg = cfg
        self.bufs = allocate(cfg, seed=1, backend=backend, layout=layout)
        specs = {n: g.kv_cache_spec for g in cfg.kv_cache_groups for n in g.layer_names}
        self.kv = {n: vb.kv_planes(backend, t, specs[n].head_size) for n, t in self.bufs.items()
                   if not isinstance(specs[n], MambaSpec)}
        self.states = {n: vb.state_views(specs[n], t) for n, t in self.bufs.items()
                       if isinstance(specs[n], MambaSpec)}
        self.connector = connector
        if connector is not None:
            vc = getattr(connector, "_vllm_config", None)  # the model's layers register there
            if vc is not None:
                vb.bind_backend(vc, cfg, vb.backend_class(backend))
            connector.register_kv_caches(self.bufs)
        # our worker's op reports reach vLLM exactly one step after their ops, however fast
        # its tier threads run: a test's hits must not depend on the machine's load
        side = getattr(connector, "worker", None)
        self.reports = StepReports(side) if hasattr(side, "take_reports") else None
        self.vocab = vocab
        self.rank = rank  # a TP rank's shard: its bytes differ from the other ranks'
        self.reqs: dict[str, Req] = {}
        self.attn = [(g, n) for g, grp in enumerate(cfg.kv_cache_groups) for n in grp.layer_names
                     if not isinstance(grp.kv_cache_spec, MambaSpec)]
        self.mamba = [(g, n) for g, grp in enumerate(cfg.kv_cache_groups) for n in grp.layer_names
                      if isinstance(grp.kv_cache_spec, MambaSpec)]
        self.checked_tokens = 0
        self.computed_tokens = 0
        self.preempted = 0
        self.sched_stats: list[Any] = []  # vLLM's SchedulerStats of every step (log_stats)
        self.bad: list[str] = []

    # ------------------------------------------------------------ the "model"
    def _kv(self, r: Req, t: int, shape: torch.Size, layer: str) -> torch.Tensor:
        return _digest(r.h(t + 1), f"{layer}@{self.rank}".encode(), shape.numel()).view(shape)

    def _state(self, r: Req, t: int, tensor: torch.Tensor, layer: str, j: int) -> torch.Tensor:
        shape = tensor.shape[1:]
        return _digest(r.h(t), f"{layer}.s{j}@{self.rank}".encode(),
                       shape.numel()).view(shape).to(tensor.dtype)

    def _check(self, rid: str, r: Req) -> None:
        c = r.computed
        for g, name in self.attn:
            k, v = self.kv[name]
            for t in range(c):
                blk, slot = r.block_ids[g][t // BLOCK], t % BLOCK
                want = self._kv(r, t, torch.Size((2, *k.shape[2:])), name)
                if not torch.equal(torch.stack((k[blk, slot], v[blk, slot])), want):
                    self.bad.append(f"{rid}: KV of token {t} in {name}")
                    return
        if c:
            for g, name in self.mamba:
                blk = r.block_ids[g][(c - 1) // BLOCK]
                for j, ts in enumerate(self.states[name]):
                    if not torch.equal(ts[blk], self._state(r, c, ts, name, j)):
                        self.bad.append(f"{rid}: state at {c} in {name}.s{j} (block {blk})")
                        return
        self.checked_tokens += c

    def _compute(self, r: Req, n: int) -> None:
        c = r.computed
        for g, name in self.attn:
            k, v = self.kv[name]
            for t in range(c, c + n):
                blk, slot = r.block_ids[g][t // BLOCK], t % BLOCK
                k[blk, slot], v[blk, slot] = self._kv(r, t, torch.Size((2, *k.shape[2:])), name)
        end = c + n
        self.computed_tokens += n
        for g, name in self.mamba:
            blk = r.block_ids[g][-(-end // BLOCK) - 1]
            for j, ts in enumerate(self.states[name]):
                ts[blk] = self._state(r, end, ts, name, j)
        r.computed = end

    def _sample(self, r: Req) -> int:
        return int.from_bytes(r.h(len(r.tokens))[:4], "little") % self.vocab

    # ------------------------------------------------------------ one step
    def step(self, so: Any) -> Any:
        from vllm.v1.outputs import ModelRunnerOutput

        self.preempted += apply_scheduler_output(
            so, self.reqs, lambda nr: Req(list(nr.prompt_token_ids),
                                          [list(b) for b in nr.block_ids], nr.num_computed_tokens,
                                          chain=[_adapter(nr)]))
        conn = self.connector
        out = None
        if conn is not None:  # the order of vLLM's GPU model runner and connector mixin
            before_forward(conn, so)
        ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            r = self.reqs[rid]
            self._check(rid, r)
            self._compute(r, so.num_scheduled_tokens[rid])
            if r.computed >= len(r.tokens):
                tok = self._sample(r)
                r.tokens.append(tok)
                sampled.append([tok])
            else:
                sampled.append([])
        if conn is not None:
            out = after_forward(conn, so)
        if self.reports is not None:
            self.reports.settle()
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled, kv_connector_output=out)


def make_scheduler(vc: Any, cfg: Any, async_scheduling: bool = False) -> Any:
    """vLLM's own ``Scheduler`` at ``BLOCK`` (it creates the connector's scheduler side);
    ``async_scheduling``: its ``AsyncScheduler`` (drive it with ``run(..., pipelined=True)``)."""
    return eng.make_scheduler(vc, cfg, BLOCK, async_scheduling)


def make_request(rid: str, prompt: list[int], max_tokens: int,
                 stop_token_ids: list[int] | None = None, **fields: Any) -> Any:
    """A vLLM ``Request`` with vLLM's block hasher at ``BLOCK`` (``stop_token_ids``: it
    also stops at one of those, as at an end-of-sequence token; ``fields``: more of
    ``Request``'s arguments, e.g. ``cache_salt``, ``lora_request``)."""
    return eng.make_request(rid, prompt, max_tokens, BLOCK, stop_token_ids, **fields)


def engine(root: Path, yaml_text: str, *, retention: int | None, num_blocks: int,
           name: str = "hybrid.yaml", async_scheduling: bool = False,
           extra: dict[str, Any] | None = None, configure: Callable[[Any], None] | None = None
           ) -> tuple[Any, Any, Runner]:
    """vLLM's ``Scheduler``, our connector's worker side (from vLLM's factory) and a
    ``Runner`` on vLLM's own buffers, for tiny Nemotron-H under ``root``, the connector
    config ``yaml_text`` (written to ``root / name``), vLLM's
    ``prefix_cache_retention_interval`` ``retention`` and ``num_blocks`` device blocks
    (``async_scheduling``: vLLM's ``AsyncScheduler``, see ``make_scheduler``). ``extra``:
    more of the connector's ``kv_connector_extra_config``; ``configure``: called with the
    ``VllmConfig`` before anything is built from it (KV events, ``kv_role``, another
    connector around ours)."""
    y = root / name
    y.write_text(yaml_text)
    vc = s.vllm_config(s.tiny_nemotron_h(root), y, retention=retention, extra=extra)
    if configure is not None:
        configure(vc)
    cfg = s.kv_cache_config(vc, num_blocks=num_blocks)
    worker = eng.make_worker(vc, cfg)
    return make_scheduler(vc, cfg, async_scheduling), worker, Runner(cfg, worker)


def _keep_stats(runner: Any, eco: Any) -> None:
    for e in eco.values():
        if e.scheduler_stats is not None and hasattr(runner, "sched_stats"):
            runner.sched_stats.append(e.scheduler_stats)


def _take(runner: Any, eco: Any, outs: dict[str, list[int]]) -> None:
    """One step's engine-core outputs: vLLM's stats kept, generated tokens per request."""
    _keep_stats(runner, eco)
    for o in (x for e in eco.values() for x in e.outputs):
        outs.setdefault(o.request_id, []).extend(o.new_token_ids)


def run(sched: Any, runner: Runner, requests: list[Any], max_steps: int = 2000,
        evict_every: int = 0, pipelined: bool = False) -> dict[str, list[int]]:
    """Serve ``requests`` one after another (each added when the previous finished, so
    later ones can hit on earlier ones); returns the tokens generated per request.
    ``evict_every``: empty vLLM's own prefix cache before every n-th request (what a busy
    engine's device cache does to an old prefix), so hits must come from the connector.
    ``pipelined``: two steps in flight, in the order of ``EngineCore.step_with_batch_queue``
    under async scheduling (``StepQueue``)."""
    outs: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
        if evict_every and i and i % evict_every == 0:
            assert sched.reset_prefix_cache()
        sched.add_request(req)
        inflight = StepQueue(sched, runner, pipelined)
        for _ in range(max_steps):
            due = inflight.step()
            if due is None:
                if inflight:
                    continue  # the batch queue is not full: schedule the next step first
                break
            _take(runner, sched.update_from_output(*due), outs)
            if not sched.has_unfinished_requests() and not inflight:
                break
        else:
            raise AssertionError("scheduler did not finish")
    so = sched.schedule()  # one more step: the last saves' reports come back
    _keep_stats(runner, sched.update_from_output(so, runner.step(so)))
    return outs


def second_turn(sched: Any, runner: Runner, turn2: list[int], pipelined: bool = False) -> int:
    """Serve ``turn2`` (4 tokens) after vLLM's own prefix cache forgot every earlier turn, so
    a hit must come from the connector, and let its saves settle; returns the tokens the
    runner computed for it."""
    assert sched.reset_prefix_cache()
    before = runner.computed_tokens
    run(sched, runner, [make_request("t2", turn2, 4)], pipelined=pipelined)
    settle(sched, runner, turn2 + [1])
    return runner.computed_tokens - before


def run_mixed(sched: Any, runner: Any, requests: list[Any], arrive_every: int = 3,
              abort: dict[str, int] | None = None, max_steps: int = 5000,
              pipelined: bool = False) -> dict[str, list[int]]:
    """Serve ``requests`` concurrently: one arrives every ``arrive_every`` steps, so prefills
    are chunked, batched with decodes and preempted when blocks run out; ``abort[rid]`` is
    the step at which request ``rid`` is aborted (if still running). Returns the tokens
    generated per request. ``pipelined``: two steps in flight, as ``run``'s."""
    from vllm.v1.request import RequestStatus

    outs: dict[str, list[int]] = {}
    pending = list(requests)
    abort = dict(abort or {})
    inflight = StepQueue(sched, runner, pipelined)
    for step in range(max_steps):
        if pending and step % arrive_every == 0:
            sched.add_request(pending.pop(0))
        for rid, at in list(abort.items()):
            if at == step:
                sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                del abort[rid]
        if not pending and not sched.has_unfinished_requests() and not inflight:
            break
        due = inflight.step()
        if due is not None:
            _take(runner, sched.update_from_output(*due), outs)
    else:
        raise AssertionError("scheduler did not finish")
    so = sched.schedule()
    sched.update_from_output(so, runner.step(so))
    return outs


def idle(sched: Any, runner: Any, steps: int = 4) -> None:
    """Step the engine ``steps`` times with nothing new to serve (what the last steps'
    saves, removals and reports need to reach the workers and come back)."""
    for _ in range(steps):
        so = sched.schedule()
        sched.update_from_output(so, runner.step(so))


def settle(sched: Any, runner: Any, tokens: list[int], deadline_s: float = 60.0) -> int:
    """Step the idle engine until every save the index knows of for ``tokens`` is reported
    stored (the puts of a finished request's tail come back a step or more after the copy)
    and vLLM released every request's blocks; returns the tokens the index then serves."""
    import time

    idx = sched.connector.sched.index
    end = time.monotonic() + deadline_s
    while True:
        plan = idx.lookup(np.asarray(tokens), alignment=1, replay=False)
        if not plan.pending_tokens and not sched.requests:
            return int(plan.num_tokens)
        if time.monotonic() > end:
            raise AssertionError(f"not settled: {plan.pending_tokens} tokens pending, "
                                 f"held: {list(sched.requests)}")
        so = sched.schedule()
        sched.update_from_output(so, runner.step(so))
        time.sleep(0.05)
