"""Helpers the trace generators share (records, token draws, lengths, ordering)."""

from __future__ import annotations

from typing import Any

import numpy as np

Record = dict[str, Any]


def finish(records: list[Record], as_arrays: bool) -> list[Record]:
    records.sort(key=lambda r: (r["ts"], str(r["session_id"]), r["turn_id"]))
    if not as_arrays:
        for r in records:
            for k in ("input_tokens", "output_tokens"):
                if isinstance(r[k], np.ndarray):
                    r[k] = r[k].tolist()
    return records


def toks(rng: np.random.Generator, n: int | np.integer, vocab: int) -> np.ndarray:
    return rng.integers(3, vocab, size=max(1, int(n)), dtype=np.int64)


def lognormal(rng: np.random.Generator, mean: float, sigma: float, lo: int, hi: int) -> int:
    """A lognormal length with the given mean (not median), clipped to [lo, hi]."""
    mu = np.log(mean) - sigma**2 / 2
    return int(np.clip(rng.lognormal(mu, sigma), lo, hi))
