"""The capacity benchmark's multi-session workloads (fixed seeds, deterministic).

* ``agentic``: ``sim.traces.agentic`` (SWE-bench-like agents: a shared scaffold, growing
  contexts with old observations collapsed, retries that branch from an earlier turn, and
  one-shot side calls behind a shared auxiliary prompt), every length times
  ``tokens_scale``.
* ``chat``: multi-turn chat sessions behind a few shared system prompts; with
  ``branch_prob`` the user regenerates the reply or edits the last message (a sibling
  request branching off the same history, then the conversation continues from one of the
  two), the shape of chat UIs' regenerate/edit buttons.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hybrid_connector.bench.schema import WorkloadSpec
from hybrid_connector.sim.traces import agentic

Record = dict[str, Any]


def _n(x: float, scale: float, lo: int = 1) -> int:
    return max(lo, round(x * scale))


def build(spec: WorkloadSpec, vocab: int = 32000) -> list[Record]:
    """The records of ``spec`` (token arrays int64), sorted by arrival time."""
    s = spec.tokens_scale
    if spec.kind == "agentic":
        return agentic(
            spec.sessions, spec.turns, spec.seed, scaffold_tokens=_n(2048, s),
            task_tokens=(_n(1000, s), _n(4000, s)), observation_mean=_n(700, s, 8),
            action_tokens=(_n(40, s), _n(300, s)), retry_prob=spec.retry_prob,
            collapsed_tokens=_n(24, s), max_input=_n(spec.max_input, s),
            side_calls=spec.side_calls, keep_last=spec.keep_last,
            sessions_per_second=spec.sessions_per_second, side_prompt_mean=_n(600, s, 8), vocab=vocab,
            as_arrays=True)
    return branching_chat(spec, vocab)


def branching_chat(spec: WorkloadSpec, vocab: int = 32000) -> list[Record]:
    """See the module docstring (``chat``)."""
    rng = np.random.default_rng(spec.seed)
    s = spec.tokens_scale

    def toks(n: float) -> np.ndarray:
        return rng.integers(3, vocab, size=max(1, int(n)), dtype=np.int64)

    def length(mean: float, lo: int, hi: int) -> int:
        m = mean * s
        return int(np.clip(rng.lognormal(np.log(m) - 0.32, 0.8), lo, hi))

    systems = [toks(_n(1024, s)) for _ in range(3)]
    out: list[Record] = []
    for sess in range(spec.sessions):
        history = systems[sess % len(systems)]
        ts = sess * 2.0
        for t in range(spec.turns):
            user = toks(length(120, 4, 4096))
            inp = np.concatenate([history, user])
            if inp.size > spec.max_input * s:
                break
            reply = toks(length(300, 8, 4096))
            out.append({"session_id": f"chat-{sess}", "turn_id": t, "ts": ts,
                        "input_tokens": inp, "output_tokens": reply})
            if rng.random() < spec.branch_prob:  # regenerate (same prompt) or edit
                alt = inp if rng.random() < 0.5 else np.concatenate([history, toks(length(120, 4, 4096))])
                alt_reply = toks(length(300, 8, 4096))
                out.append({"session_id": f"chat-{sess}", "turn_id": t, "ts": ts + 5.0,
                            "input_tokens": alt, "output_tokens": alt_reply})
                if rng.random() < 0.5:
                    inp, reply = alt, alt_reply
            history = np.concatenate([inp, reply])
            ts += 20.0 + rng.exponential(20.0)
    out.sort(key=lambda r: (r["ts"], str(r["session_id"]), r["turn_id"]))
    return out


def summary(records: list[Record]) -> dict[str, float]:
    ins = [len(r["input_tokens"]) for r in records]
    return {"requests": len(records), "sessions": len({r["session_id"] for r in records}),
            "prompt_tokens": int(sum(ins)), "mean_prompt": float(np.mean(ins)) if ins else 0.0,
            "max_prompt": int(max(ins, default=0))}
