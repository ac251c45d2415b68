"""The model-runner side of the head-to-head: executes each ``SchedulerOutput`` of vLLM's
``Scheduler`` on vLLM's own paged buffers the way the GPU model runner does in align mode,
and checks every byte a hit restored.

The "model" is a deterministic function of the token prefix, so what a request reads can
be checked whatever put it there (vLLM's prefix cache or a connector's load): the K and V
of token t in attention layer ``l`` are the 16-byte hash of ``tokens[:t + 1]`` (tiled over
the heads) plus ``256 * (2l)`` and ``256 * (2l + 1)``; the recurrent state after t tokens
is the hash of ``tokens[:t]`` tiled over the state tensors plus a per-layer tag. A step
writes the new tokens' KV and the state at its end into block ``cdiv(end, block) - 1``
(align mode's running block). When a request first runs from ``c > 0`` computed tokens
(its hit), the KV of ``[0, c)`` in its attention blocks and the state in block
``(c - 1) // block`` of every Mamba/GDN group are compared with what the model would have
written (``bad`` lists mismatches). Output tokens are the trace's recorded ones (teacher
forcing), so a later turn's prompt can hit on an earlier turn's answer.

The step follows ``KVConnectorModelRunnerMixin`` and ``gpu_model_runner``: ``handle_preemptions``,
``bind_connector_metadata``, ``start_load_kv`` (before the forward for sync loads, after
it otherwise), ``wait_for_save``, ``get_transfer_results`` and the worker metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hybrid_connector.bench.vllm_peers.mixin_order import after_forward, before_forward
from hybrid_connector.bench.vllm_peers.prefix_hash import prefix_hash
from hybrid_connector.bench.vllm_peers.sched_output import apply_scheduler_output


@dataclass
class _Req:
    tokens: list[int]
    out: list[int]
    prompt: int
    block_ids: list[list[int]]
    computed: int = 0
    checked: bool = False
    chain: list[bytes] = field(default_factory=lambda: [b"\0" * 16])

    def h(self, t: int) -> bytes:
        return prefix_hash(self.chain, self.tokens, t)

    def resumed(self) -> None:
        """After a preemption (new tokens from vLLM): re-derive hashes, check again."""
        self.chain = self.chain[: len(self.tokens) + 1]
        self.checked = False

    def hashes(self, a: int, b: int) -> np.ndarray:
        """``[b - a, 16]`` float32: the hash of ``tokens[:t + 1]`` for t in [a, b)."""
        self.h(b)
        raw = b"".join(self.chain[a + 1: b + 1])
        return np.frombuffer(raw, dtype=np.uint8).reshape(b - a, 16).astype(np.float32)


class Runner:
    """Executes scheduler outputs (module docstring). ``outputs[rid]``: the tokens request
    ``rid`` samples (its recorded answer)."""

    def __init__(self, cfg: Any, bufs: dict[str, torch.Tensor], connector: Any | None,
                 block: int, backend: str) -> None:
        from vllm.v1.kv_cache_interface import MambaSpec

        from hybrid_connector.bench.vllm_peers import buffers as vb

        self.block = block
        specs = {n: g.kv_cache_spec for g in cfg.kv_cache_groups for n in g.layer_names}
        self.attn = [(g, n, vb.kv_planes(backend, bufs[n], specs[n].head_size))
                     for g, grp in enumerate(cfg.kv_cache_groups) for n in grp.layer_names
                     if not isinstance(grp.kv_cache_spec, MambaSpec)]
        self.mamba = [(g, n, vb.state_views(specs[n], bufs[n]))
                      for g, grp in enumerate(cfg.kv_cache_groups) for n in grp.layer_names
                      if isinstance(grp.kv_cache_spec, MambaSpec)]
        self.connector = connector
        if connector is not None:
            connector.register_kv_caches(bufs)
        self.outputs: dict[str, list[int]] = {}
        self.reqs: dict[str, _Req] = {}
        self.first_hit: dict[str, int] = {}  # num_computed_tokens at a request's first schedule
        self.checked_tokens = 0
        self.computed_prompt_tokens = 0
        self.preempted = 0
        self.bad: list[str] = []

    # ------------------------------------------------------------ the "model"
    def _kv(self, r: _Req, a: int, b: int, li: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        width = like.shape[-1] * like.shape[-2]
        h = np.tile(r.hashes(a, b), (1, -(-width // 16)))[:, :width]
        base = torch.from_numpy(h).view(b - a, *like.shape[-2:])
        return base + 512.0 * li, base + 512.0 * li + 256.0

    def _state(self, r: _Req, t: int, li: int, j: int, ts: torch.Tensor) -> torch.Tensor:
        n = ts[0].numel()
        h = np.frombuffer(r.h(t), dtype=np.uint8).astype(np.float32)
        v = np.tile(h, -(-n // 16))[:n] + float(16 * li + j)
        return torch.from_numpy(v).view(ts.shape[1:]).to(ts.dtype)

    def _slots(self, r: _Req, g: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = np.arange(a, b)
        ids = np.asarray(r.block_ids[g], dtype=np.int64)
        return torch.from_numpy(ids[t // self.block]), torch.from_numpy(t % self.block)

    def _check(self, rid: str, r: _Req) -> None:
        c = r.computed
        r.checked = True
        if c == 0:
            return
        nb = -(-c // self.block)
        for li, (g, name, (k, v)) in enumerate(self.attn):
            ids = torch.tensor(r.block_ids[g][:nb], dtype=torch.long)
            wk, wv = self._kv(r, 0, c, li, k)
            got_k = k.index_select(0, ids).reshape(nb * self.block, *k.shape[2:])[:c]
            got_v = v.index_select(0, ids).reshape(nb * self.block, *v.shape[2:])[:c]
            if not (torch.equal(got_k, wk) and torch.equal(got_v, wv)):
                self.bad.append(f"{rid}: KV of [0, {c}) in {name}")
                return
        for li, (g, name, states) in enumerate(self.mamba):
            blk = r.block_ids[g][(c - 1) // self.block]
            for j, ts in enumerate(states):
                if not torch.equal(ts[blk], self._state(r, c, li, j, ts)):
                    self.bad.append(f"{rid}: state at {c} in {name}.s{j} (block {blk})")
                    return
        self.checked_tokens += c

    def _compute(self, r: _Req, n: int) -> None:
        c: int = r.computed
        end = c + n
        for li, (g, _name, (k, v)) in enumerate(self.attn):
            blk, slot = self._slots(r, g, c, end)
            k[blk, slot], v[blk, slot] = self._kv(r, c, end, li, k)
        for li, (g, _name, states) in enumerate(self.mamba):
            run_blk = r.block_ids[g][-(-end // self.block) - 1]
            for j, ts in enumerate(states):
                ts[run_blk] = self._state(r, end, li, j, ts)
        self.computed_prompt_tokens += max(0, min(end, r.prompt) - c)
        r.computed = end

    # ------------------------------------------------------------ one step
    def _new_req(self, nr: Any) -> _Req:
        self.first_hit.setdefault(nr.req_id, nr.num_computed_tokens)
        p = list(nr.prompt_token_ids)
        return _Req(p, self.outputs.get(nr.req_id, []), len(p), [list(b) for b in nr.block_ids],
                    nr.num_computed_tokens)

    def step(self, so: Any) -> Any:
        from vllm.v1.outputs import ModelRunnerOutput

        self.preempted += apply_scheduler_output(so, self.reqs, self._new_req)
        conn = self.connector
        if conn is not None:
            before_forward(conn, so)
        ids = list(so.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            r = self.reqs[rid]
            if not r.checked:
                self._check(rid, r)
            self._compute(r, so.num_scheduled_tokens[rid])
            if r.computed >= len(r.tokens):
                done = len(r.tokens) - r.prompt
                tok = r.out[done] if done < len(r.out) else 0
                r.tokens.append(tok)
                sampled.append([tok])
            else:
                sampled.append([])
        out = None
        if conn is not None:
            out = after_forward(conn, so)
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled, kv_connector_output=out)
