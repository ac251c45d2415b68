"""The best any connector could do on a trace inside vLLM: an unlimited cache under vLLM's
hit rules, so each row of the head-to-head can be read against what is possible at all.

Per request, in trace order, the ceiling hit is the longest prefix of its prompt that an
earlier request's input + output held, cut to where vLLM can resume a hybrid model:

* at a block boundary (align mode keeps KV and the recurrent state there), or
* exactly where an earlier request's prompt ended or its last computed token was (the
  states a connector can keep there: the prompt end, ``register_finished_partial_tail``),

and at most ``prompt - 1`` tokens (vLLM computes at least the last prompt token). A cache
that kept KV for every block and a state at every such position forever would hit exactly
this; no connector hits more, whatever its budget. ``reusable_share`` of
``sim.working_set.trace_stats`` is the looser token-exact figure without vLLM's rules.

``ceiling`` returns the hit rate, the tokens left to compute and the modeled time to first
token of those hits (``ttft.TTFTModel``, loads taken as free: a floor for any connector).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from hybrid_connector.bench.vllm_peers.ttft import TTFTModel
from hybrid_connector.sim.working_set import SeenSequences


def _digest(b: bytes) -> bytes:
    return hashlib.blake2b(b, digest_size=16).digest()


def request_hits(records: Sequence[dict[str, Any]], block: int) -> list[tuple[int, int]]:
    """(prompt tokens, ceiling hit tokens) per request of ``records`` (module docstring)."""
    if block < 1:
        raise ValueError("block must be >= 1")
    seen = SeenSequences()  # every earlier input+output
    ends: set[bytes] = set()  # digests of every earlier exact-end prefix
    out = []
    for r in records:
        inp = np.asarray(r["input_tokens"], dtype=np.int64)
        seq = np.concatenate([inp, np.asarray(r["output_tokens"], dtype=np.int64)])
        key = seen.key(seq)
        m = seen.longest(key)
        cap = min(m, inp.size - 1)
        hit = max(0, cap // block * block)
        for n in range(cap, hit, -1):  # an exact end between the block floor and the cap
            if _digest(key[: 4 * n]) in ends:
                hit = n
                break
        out.append((int(inp.size), hit))
        seen.add(key)
        ends.add(_digest(key[: 4 * inp.size]))
        ends.add(_digest(key[: 4 * (seq.size - 1)]))
    return out


def ceiling(records: Sequence[dict[str, Any]], block: int, model: TTFTModel) -> dict[str, float]:
    """``hit_rate``, ``recomputed`` (prompt tokens left to compute) and ``ttft_ms`` (mean
    modeled time to first token, loads free) of the unlimited cache of the module docstring."""
    per = request_hits(records, block)
    prompt = sum(p for p, _ in per)
    hits = sum(h for _, h in per)
    ttft = [model.compute_s(p, h) + model.overhead_s for p, h in per]
    return {"hit_rate": hits / prompt if prompt else 0.0, "recomputed": float(prompt - hits),
            "ttft_ms": 1e3 * float(np.mean(ttft)) if ttft else 0.0}
