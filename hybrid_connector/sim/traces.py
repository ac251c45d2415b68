"""Synthetic traces. Records are dicts with ``session_id``, ``turn_id``, ``ts``,
``input_tokens`` and ``output_tokens`` (lists of ints), the reference simulator's JSONL
format. Generators are deterministic for a given seed."""

from __future__ import annotations

import random
from typing import Any


def multi_turn_chat(
    num_sessions: int,
    turns: int,
    seed: int,
    system_prompt: int = 256,
    user_tokens: tuple[int, int] = (32, 256),
    output_tokens: tuple[int, int] = (32, 256),
    vocab: int = 32000,
    session_gap: float = 1.0,
    think_time: float = 20.0,
) -> list[dict[str, Any]]:
    """Chat sessions sharing one system prompt; each turn's input is the whole history
    plus a new user message (LMSys/ShareGPT-like lengths drawn uniformly in the ranges).
    Sorted by ``ts``."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_prompt)]
    out: list[dict[str, Any]] = []
    for s in range(num_sessions):
        history = list(system)
        ts = s * session_gap
        for t in range(turns):
            user = [rng.randrange(vocab) for _ in range(rng.randint(*user_tokens))]
            reply = [rng.randrange(vocab) for _ in range(rng.randint(*output_tokens))]
            inp = history + user
            out.append({"session_id": s, "turn_id": t, "ts": ts,
                        "input_tokens": inp, "output_tokens": reply})
            history = inp + reply
            ts += rng.expovariate(1.0 / think_time)
    out.sort(key=lambda r: (r["ts"], r["session_id"], r["turn_id"]))
    return out
