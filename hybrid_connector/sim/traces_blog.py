"""The two traces of the Marconi blog post's eviction check (``blog_agentic``, ``blog_chat``).

The post (a reader's re-check of Marconi's FLOP-aware eviction, 7B hybrid, 6 GiB budget)
describes them only in words: trace A, agentic, "15 long prefixes (4K-12K tokens) each
reused ~20 times, plus 40 hot short prefixes"; trace B, chat-like, "the same short
prefixes but the long entries appear once or twice and die". FLOP-aware eviction beats LRU
on A and loses to it on B, which is what an auto alpha must follow. What the post leaves
open is fixed here, and documented per argument:

* A request is a prefix plus a fresh suffix (a question, a tool call: uniform in
  ``suffix_tokens``) and a short answer; no request shares its suffix with another.
* Hot short prefixes: uniform in ``hot_tokens``, chosen Zipf(``zipf_a``).
* A: every long prefix (uniform in ``long_tokens``) is used a Poisson(``reuses``) number of
  times (at least 2) at uniformly random points of the trace; the rest of the requests
  (``short_share`` of all) use a hot prefix.
* B: ``long_entries`` long prefixes, each used once or, with ``repeat_prob``, twice: the
  second use is the first one's follow-up turn (its input and answer plus a fresh suffix,
  an exponential ``repeat_gap`` requests later); the same share of hot requests.

Arrivals are Poisson at ``rate``/s; both are pure functions of their arguments.
"""

from __future__ import annotations

import numpy as np

from hybrid_connector.sim.trace_util import Record, finish, toks


def _hot(rng: np.random.Generator, n: int, tokens: tuple[int, int], zipf_a: float,
         vocab: int) -> tuple[list[np.ndarray], np.ndarray]:
    hot = [toks(rng, rng.integers(*tokens, endpoint=True), vocab) for _ in range(n)]
    pop = 1.0 / np.arange(1, n + 1) ** zipf_a
    return hot, pop / pop.sum()


def _records(rng: np.random.Generator, slots: list[np.ndarray | int | None], hot: list[np.ndarray],
             pop: np.ndarray, suffix: tuple[int, int], output: tuple[int, int], rate: float,
             vocab: int) -> list[Record]:
    """One request per slot: the slot's long prefix plus a fresh suffix, a hot prefix plus
    one (``None``), or (an int) the follow-up turn of that earlier request: its input and
    answer plus a fresh suffix."""
    out: list[Record] = []
    ts = 0.0
    for i, slot in enumerate(slots):
        sid, turn = f"blog-{i}", 0
        if isinstance(slot, int):
            first = out[slot]
            sid, turn = first["session_id"], 1
            prefix = np.concatenate([first["input_tokens"], first["output_tokens"]])
        else:
            prefix = slot if slot is not None else hot[int(rng.choice(len(hot), p=pop))]
        inp = np.concatenate([prefix, toks(rng, rng.integers(*suffix, endpoint=True), vocab)])
        out.append({"session_id": sid, "turn_id": turn, "ts": float(ts), "input_tokens": inp,
                    "output_tokens": toks(rng, rng.integers(*output, endpoint=True), vocab)})
        ts += rng.exponential(1.0 / rate)
    return out


def blog_agentic(
    long_prefixes: int = 15,
    reuses: float = 20.0,
    seed: int = 0,
    hot_prefixes: int = 40,
    short_share: float = 0.5,
    long_tokens: tuple[int, int] = (4096, 12288),
    hot_tokens: tuple[int, int] = (256, 1024),
    suffix_tokens: tuple[int, int] = (64, 512),
    output_tokens: tuple[int, int] = (32, 256),
    zipf_a: float = 1.0,
    rate: float = 2.0,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """Trace A: ``long_prefixes`` long prefixes reused ~``reuses`` times each, spread over
    the trace, between requests on ``hot_prefixes`` hot short ones (``short_share`` of all)."""
    if long_prefixes < 1 or reuses <= 0 or hot_prefixes < 1 or not 0 <= short_share < 1:
        raise ValueError("long_prefixes, hot_prefixes >= 1, reuses > 0, short_share in [0, 1)")
    rng = np.random.default_rng(seed)
    hot, pop = _hot(rng, hot_prefixes, hot_tokens, zipf_a, vocab)
    longs = [toks(rng, rng.integers(*long_tokens, endpoint=True), vocab) for _ in range(long_prefixes)]
    uses: list[np.ndarray | int | None] = [
        p for p in longs for _ in range(max(2, int(rng.poisson(reuses))))]
    n_short = int(round(len(uses) * short_share / (1 - short_share)))
    slots = uses + [None] * n_short
    order = rng.permutation(len(slots))
    return finish(_records(rng, [slots[i] for i in order], hot, pop, suffix_tokens,
                           output_tokens, rate, vocab), as_arrays)


def blog_chat(
    long_entries: int = 500,
    hot_prefixes: int = 40,
    seed: int = 0,
    repeat_prob: float = 0.5,
    short_share: float = 0.5,
    repeat_gap: float = 10.0,
    long_tokens: tuple[int, int] = (4096, 12288),
    hot_tokens: tuple[int, int] = (256, 1024),
    suffix_tokens: tuple[int, int] = (64, 512),
    output_tokens: tuple[int, int] = (32, 256),
    zipf_a: float = 1.0,
    rate: float = 2.0,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """Trace B: ``long_entries`` long prefixes used once, or with ``repeat_prob`` twice
    (~``repeat_gap`` requests apart), then never again, between requests on the hot short
    prefixes (``short_share`` of all)."""
    if long_entries < 1 or hot_prefixes < 1 or not 0 <= repeat_prob <= 1 or not 0 <= short_share < 1:
        raise ValueError("long_entries, hot_prefixes >= 1, repeat_prob in [0, 1], short_share in [0, 1)")
    rng = np.random.default_rng(seed)
    hot, pop = _hot(rng, hot_prefixes, hot_tokens, zipf_a, vocab)
    firsts = [toks(rng, rng.integers(*long_tokens, endpoint=True), vocab) for _ in range(long_entries)]
    repeat = rng.random(long_entries) < repeat_prob
    n_long = long_entries + int(repeat.sum())
    n_short = int(round(n_long * short_share / (1 - short_share)))
    keys: list[tuple[float, int]] = []  # (position, entry): first uses uniform, repeats after
    for e in range(long_entries):
        pos = float(rng.uniform(0, n_long + n_short))
        keys.append((pos, e))
        if repeat[e]:
            keys.append((pos + 1 + float(rng.exponential(repeat_gap)), e))
    keys += [(float(rng.uniform(0, n_long + n_short)), -1) for _ in range(n_short)]
    keys.sort()
    slots: list[np.ndarray | int | None] = []
    first_at: dict[int, int] = {}
    for _, e in keys:
        if e < 0:
            slots.append(None)
        elif e in first_at:
            slots.append(first_at[e])  # the follow-up of the entry's first request
        else:
            first_at[e] = len(slots)
            slots.append(firsts[e])
    return finish(_records(rng, slots, hot, pop, suffix_tokens, output_tokens, rate, vocab),
                  as_arrays)
