"""The public Mooncake trace format: reader, writer, synthetic rows, and replay as records.

A Mooncake trace (``kvcache-ai/Mooncake``, ``FAST25-release/traces/*.jsonl`` and the
earlier ``mooncake_trace.jsonl``) is JSONL with one request a line: ``timestamp`` (ms),
``input_length``, ``output_length`` (tokens) and ``hash_ids``, one id per 512-token block
of the input (the last block partial), equal ids meaning equal prefixes. The tokens are
not published; ``to_records`` turns each id into a deterministic block of token ids (a
function of the id and ``seed`` only, so equal ids give equal blocks), cut to
``input_length``; answers are fresh tokens. ``scale`` divides the block (512 -> 32 at
``scale=16``) and every length, keeping each request's block count.

``synthetic_rows`` writes rows in that format shaped like the FAST'25 conversation trace
(every request opens with block 0; conversations come back with their earlier blocks plus
new ones); ``mooncake`` chains the two for ``gen-trace``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybrid_connector.sim.trace_util import Record, finish, lognormal

BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_M64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (uint64 in, uint64 out): a stateless, seedable token source."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_M64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def block_tokens(hash_id: int, seed: int, block: int = BLOCK_TOKENS, vocab: int = 32000,
                 domain: int = 0) -> np.ndarray:
    """The ``block`` token ids of ``hash_id`` (in ``[3, vocab)``), a function of its args."""
    base = (int(hash_id) * 0x100000001B3 + int(seed) * 0x9E3779B1 + domain * 0x85EBCA77) & _M64
    with np.errstate(over="ignore"):
        x = _mix(np.uint64(base) + np.arange(block, dtype=np.uint64))
    return (3 + x % np.uint64(vocab - 3)).astype(np.int64)


def block_tokens_many(hash_ids: Sequence[int], seed: int, block: int = BLOCK_TOKENS,
                      vocab: int = 32000) -> np.ndarray:
    """``block_tokens`` of every id, concatenated (one vectorised pass)."""
    ids = np.asarray(hash_ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        base = (ids * np.uint64(0x100000001B3) + np.uint64((int(seed) * 0x9E3779B1) & _M64))
        x = _mix((base[:, None] + np.arange(block, dtype=np.uint64)[None, :]).ravel())
    return (3 + x % np.uint64(vocab - 3)).astype(np.int64)


def check_row(row: Any, where: str = "row", block: int = BLOCK_TOKENS) -> dict[str, Any]:
    """Validate one Mooncake row; raise ValueError naming ``where`` and the field."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object")
    missing = [k for k in FIELDS if k not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    ids, n_in = row["hash_ids"], row["input_length"]
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"{where}: 'hash_ids' must be a list of non-negative integers")
    for k in ("timestamp", "input_length", "output_length"):
        if isinstance(row[k], bool) or not isinstance(row[k], int | float) or row[k] < 0:
            raise ValueError(f"{where}: {k!r} must be a non-negative number")
    if n_in < 1 or len(ids) != math.ceil(n_in / block):
        raise ValueError(f"{where}: {len(ids)} hash_ids for input_length {n_in} "
                         f"(expected ceil({n_in}/{block}) = {math.ceil(n_in / block)})")
    return row


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read and validate a Mooncake-format JSONL file (file order kept)."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{i}: not JSON: {exc.msg}") from None
                rows.append(check_row(obj, f"{path}:{i}"))
    return rows


def write_rows(rows: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> int:
    """Write rows in the Mooncake format (its four fields, in its order)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in FIELDS}) + "\n")
            n += 1
    return n


def to_records(rows: Sequence[dict[str, Any]], seed: int = 0, scale: int = 1, vocab: int = 32000,
               block: int = BLOCK_TOKENS, as_arrays: bool = False) -> list[Record]:
    """Rows as trace records (``session_id`` ``mc-<line>``, ``ts`` in s, ``hash_ids`` kept).

    Input: the blocks of ``hash_ids`` (``block / scale`` tokens each) cut to the input
    length divided by ``scale`` and kept within the last block; output: fresh tokens."""
    if scale < 1 or block % scale:
        raise ValueError(f"scale must be >= 1 and divide the block ({block})")
    b = block // scale
    out: list[Record] = []
    for i, r in enumerate(rows):
        ids = check_row(r, f"row {i}", block)["hash_ids"]
        n = min(max(math.ceil(r["input_length"] / scale), (len(ids) - 1) * b + 1), len(ids) * b)
        # Recomputed, not cached: the real traces hold ~10^5 ids (a cache would be GBs).
        inp = block_tokens_many(ids, seed, b, vocab)[:n]
        m = max(1, round(r["output_length"] / scale))
        ans = block_tokens(i, seed, m, vocab, domain=1)
        out.append({"session_id": f"mc-{i}", "turn_id": 0, "ts": r["timestamp"] / 1000.0,
                    "input_tokens": inp, "output_tokens": ans, "hash_ids": list(ids)})
    return finish(out, as_arrays)


def synthetic_rows(num_requests: int, max_turns: int, seed: int, followup_prob: float = 0.4,
                   first_mean: int = 9000, user_mean: int = 300, output_mean: int = 350,
                   max_input: int = 131072, rate: float = 1.0,
                   block: int = BLOCK_TOKENS) -> list[dict[str, Any]]:
    """Mooncake-format rows like the FAST'25 conversation trace: ``num_requests`` requests
    (Poisson at ``rate``/s, ms timestamps), each opening with block 0 (the shared system
    prompt). With ``followup_prob`` a request continues a recent conversation (of fewer than
    ``max_turns`` requests): its earlier full input blocks, then new blocks for the rest of
    the previous input, the previous answer and a new message (lognormal, mean
    ``user_mean``); else a new conversation (lognormal, mean ``first_mean``, sigma 1.0, in
    [600, ``max_input``]). Answers are lognormal (mean ``output_mean``, sigma 0.8)."""
    if num_requests < 0 or max_turns < 1 or not 0 <= followup_prob <= 1:
        raise ValueError("num_requests >= 0, max_turns >= 1 and followup_prob in [0, 1] required")
    rng = np.random.default_rng([seed, 2])
    rows: list[dict[str, Any]] = []
    convs: list[list[int]] = []  # row indices of each conversation
    next_id, ts = 1, 0.0
    for _ in range(num_requests):
        open_ = [c for c in convs[-64:] if len(c) < max_turns]
        if open_ and rng.random() < followup_prob:
            conv = open_[int(rng.integers(len(open_)))]
            prev = rows[conv[-1]]
            n_in = min(max_input, prev["input_length"] + prev["output_length"] + lognormal(rng, user_mean, 1.0, 8, 4096))
            keep = min(prev["input_length"] // block, math.ceil(n_in / block))
            ids = prev["hash_ids"][:keep]
        else:
            conv, n_in, ids = [], lognormal(rng, first_mean, 1.0, 600, max_input), [0]
            convs.append(conv)
        extra = math.ceil(n_in / block) - len(ids)
        ids = ids + list(range(next_id, next_id + extra))
        next_id += extra
        conv.append(len(rows))
        rows.append({"timestamp": int(ts * 1000), "input_length": int(n_in),
                     "output_length": lognormal(rng, output_mean, 0.8, 1, 2048), "hash_ids": ids})
        ts += rng.exponential(1.0 / rate)
    return rows


def mooncake(num_requests: int, max_turns: int, seed: int, scale: int = 1, vocab: int = 32000,
             as_arrays: bool = False) -> list[Record]:
    """``synthetic_rows`` replayed through ``to_records`` (the ``gen-trace mooncake`` family)."""
    return to_records(synthetic_rows(num_requests, max_turns, seed), seed, scale, vocab,
                      as_arrays=as_arrays)
