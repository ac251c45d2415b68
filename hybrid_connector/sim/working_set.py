"""A trace's reuse statistics and working set, independent of any cache policy.

``trace_stats`` walks a trace once, in order, and measures, token-exactly, what a cache with
unlimited room could reuse: for each request the longest prefix of its input that some
earlier request's input+output already held (``reusable_tokens``), the distinct tokens of
the prefix tree of every input+output (``unique_tokens``), and the distinct positions where
a reuse ends (``hit_positions``: where a hybrid model needs a recurrent state for that hit
to be exact). It also measures, at ``block_tokens`` granularity, the peak over the trace of
the tokens (and hit positions) still due a reuse: each block counts from the request that
first holds it to the last request that reuses it (``live_peak_tokens``,
``live_peak_states``), which is what a clairvoyant cache must hold.

``working_set_bytes`` turns either measure into bytes for a model geometry: tokens x KV
bytes per token + states x state bytes. ``measure="unique"`` (default) is the whole
footprint (every budget at or above it never evicts); ``measure="live_peak"`` is the
clairvoyant peak (budgets below it must lose hits). Budgets are swept as multiples of one
of them. ``bench.setups.working_set`` is the policy-dependent counterpart (what a given
configuration of this project stores, through the real cache).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from hybrid_connector.geometry.model import ModelGeometry

Record = dict[str, Any]


def _lcp(a: bytes, b: bytes) -> int:
    """Common prefix length, in tokens, of two big-endian uint32 token strings."""
    x, y = np.frombuffer(a, dtype=">u4"), np.frombuffer(b, dtype=">u4")
    n = min(x.size, y.size)
    diff = np.flatnonzero(x[:n] != y[:n])
    return int(diff[0]) if diff.size else n


class SeenSequences:
    """Every token sequence added so far, kept sorted so that the longest common prefix of a
    new one with any of them is one of its two neighbours'."""

    def __init__(self) -> None:
        self._seen: list[bytes] = []

    @staticmethod
    def key(seq: np.ndarray) -> bytes:
        """``seq`` as the byte string ``longest`` and ``add`` take (4 bytes per token)."""
        return np.asarray(seq).astype(">u4").tobytes()

    def longest(self, key: bytes) -> int:
        """Tokens of ``key`` that some added sequence holds as its own prefix's."""
        j = bisect.bisect_left(self._seen, key)
        return max((_lcp(key, self._seen[k]) for k in (j - 1, j) if 0 <= k < len(self._seen)),
                   default=0)

    def add(self, key: bytes) -> None:
        bisect.insort(self._seen, key)


def _blocks(seq: np.ndarray, block: int) -> list[int]:
    """Chained hashes of the full ``block``-token blocks of ``seq`` (a prefix identity)."""
    out, h = [], 0
    raw = seq.astype("<i8").tobytes()
    step = 8 * block
    for k in range(seq.size // block):
        h = hash((h, raw[k * step:(k + 1) * step]))
        out.append(h)
    return out


def trace_stats(records: Sequence[Record], block_tokens: int = 16) -> dict[str, float]:
    """Reuse statistics of ``records`` in their order (see the module docstring).

    Keys: ``requests``, ``prompt_tokens``, ``mean_prompt``, ``max_prompt``,
    ``unique_tokens``, ``reusable_tokens``, ``reusable_share`` (reusable / prompt tokens:
    the token hit rate of an unlimited exact-prefix cache), ``hit_positions``,
    ``live_peak_tokens`` and ``live_peak_states`` (block granularity)."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be >= 1")
    seen = SeenSequences()  # every earlier input+output
    hits: set[bytes] = set()
    prompt = unique = reusable = max_prompt = 0
    born: dict[int, int] = {}
    last: dict[int, int] = {}
    hit_last: dict[int, int] = {}
    for i, r in enumerate(records):
        inp = np.asarray(r["input_tokens"], dtype=np.int64)
        seq = np.concatenate([inp, np.asarray(r["output_tokens"], dtype=np.int64)])
        key = seen.key(seq)
        m = seen.longest(key)
        seen.add(key)
        unique += seq.size - m
        got = min(m, inp.size)
        reusable += got
        prompt += inp.size
        max_prompt = max(max_prompt, int(inp.size))
        if got:
            hits.add(hashlib.blake2b(key[: 4 * got], digest_size=16).digest())
        blocks = _blocks(seq, block_tokens)
        nin = min(got, inp.size) // block_tokens
        for k, h in enumerate(blocks):
            if h not in born:
                born[h] = i
            elif k < nin:
                last[h] = i
        if nin:
            hit_last[blocks[nin - 1]] = i
    n = len(records) + 1
    live_t = np.zeros(n, dtype=np.int64)
    live_s = np.zeros(n, dtype=np.int64)
    for h, j in last.items():
        live_t[born[h]] += 1
        live_t[j + 1] -= 1
    for h, j in hit_last.items():
        if j > born[h]:
            live_s[born[h]] += 1
            live_s[j + 1] -= 1
    if not records:
        return {"requests": 0}
    return {
        "requests": len(records),
        "prompt_tokens": float(prompt),
        "mean_prompt": prompt / len(records),
        "max_prompt": float(max_prompt),
        "unique_tokens": float(unique),
        "reusable_tokens": float(reusable),
        "reusable_share": reusable / prompt if prompt else 0.0,
        "hit_positions": float(len(hits)),
        "live_peak_tokens": float(block_tokens * int(np.cumsum(live_t).max())),
        "live_peak_states": float(np.cumsum(live_s).max()),
    }


def working_set_bytes(records: Sequence[Record], geometry: ModelGeometry,
                      measure: str = "unique", stats: dict[str, float] | None = None,
                      block_tokens: int = 16) -> int:
    """Bytes of ``records``' working set for ``geometry``: tokens x KV bytes per token +
    states x state bytes, with ``measure`` ``"unique"`` (unique prefix tokens and hit
    positions) or ``"live_peak"`` (the clairvoyant peak at ``block_tokens`` granularity).
    ``stats`` reuses a ``trace_stats`` result. Budgets for a sweep are multiples of this."""
    if measure not in ("unique", "live_peak"):
        raise ValueError(f"measure must be 'unique' or 'live_peak', got {measure!r}")
    s = stats if stats is not None else trace_stats(records, block_tokens)
    if not s.get("requests"):
        return 0
    tokens, states = ((s["unique_tokens"], s["hit_positions"]) if measure == "unique"
                      else (s["live_peak_tokens"], s["live_peak_states"]))
    return int(tokens) * geometry.kv_bytes_per_token() + int(states) * geometry.state_bytes()


BUDGET_MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0)  # the head-to-head's host budget sweep


def budget_sweep(working_set: int, multiples: Sequence[float] = BUDGET_MULTIPLES) -> dict[float, int]:
    """Host budgets (bytes) at each multiple of ``working_set`` (bytes), in the given order."""
    if working_set < 0 or any(m <= 0 for m in multiples):
        raise ValueError("working_set >= 0 and positive multiples required")
    return {float(m): int(m * working_set) for m in multiples}
