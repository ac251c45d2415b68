"""A chat-like trace where recency is right: hot short prefixes, long bodies that die.

``oneshot_chat`` imitates chat front-ends and RAG calls: most requests start with one of a
few short hot prefixes (system prompts, the shapes of an agent's scaffold and auxiliary
prompt), followed by a long body (a pasted document, a retrieved context) that is seen once,
or with ``repeat_prob`` once more shortly after (a follow-up question), and never again.
FLOPs per byte favours the long bodies (a long edge saves many FLOPs per state byte) though
they are dead; recency keeps the hot prefixes and the bodies still due a follow-up. It is
the family where alpha 0 (LRU) is the right answer and a FLOP-aware eviction must not lose.
"""

from __future__ import annotations

import numpy as np

from hybrid_connector.sim.trace_util import Record, finish, lognormal, toks


def oneshot_chat(
    num_requests: int,
    hot_prefixes: int,
    seed: int,
    hot_tokens: tuple[int, int] = (256, 2048),
    zipf_a: float = 1.0,
    body_mean: int = 3000,
    body_sigma: float = 0.7,
    repeat_prob: float = 0.5,
    repeat_gap_s: float = 6.0,
    output_tokens: tuple[int, int] = (16, 256),
    followup_tokens: tuple[int, int] = (8, 64),
    rate: float = 2.0,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """``num_requests`` first requests (Poisson at ``rate``/s), each a Zipf(``zipf_a``)-chosen
    hot prefix (uniform in ``hot_tokens``) plus a fresh lognormal body (mean ``body_mean``,
    sigma ``body_sigma``, clipped to [64, 16384]) and a short answer; with ``repeat_prob`` a
    follow-up (same session, turn 1) arrives an exponential ``repeat_gap_s`` later with the
    previous input, answer and a short question. Pure function of the arguments."""
    if num_requests < 0 or hot_prefixes < 1 or not 0 <= repeat_prob <= 1:
        raise ValueError("num_requests >= 0, hot_prefixes >= 1, repeat_prob in [0, 1] required")
    rng = np.random.default_rng(seed)
    hot = [toks(rng, rng.integers(*hot_tokens, endpoint=True), vocab) for _ in range(hot_prefixes)]
    pop = 1.0 / np.arange(1, hot_prefixes + 1) ** zipf_a
    pop /= pop.sum()
    out: list[Record] = []
    ts = 0.0
    for i in range(num_requests):
        body = toks(rng, lognormal(rng, body_mean, body_sigma, 64, 16384), vocab)
        inp = np.concatenate([hot[int(rng.choice(hot_prefixes, p=pop))], body])
        ans = toks(rng, rng.integers(*output_tokens, endpoint=True), vocab)
        out.append({"session_id": f"os-{i}", "turn_id": 0, "ts": float(ts),
                    "input_tokens": inp, "output_tokens": ans})
        if rng.random() < repeat_prob:
            q = toks(rng, rng.integers(*followup_tokens, endpoint=True), vocab)
            out.append({"session_id": f"os-{i}", "turn_id": 1,
                        "ts": float(ts + rng.exponential(repeat_gap_s)),
                        "input_tokens": np.concatenate([inp, ans, q]),
                        "output_tokens": toks(rng, rng.integers(*output_tokens, endpoint=True), vocab)})
        ts += rng.exponential(1.0 / rate)
    return finish(out, as_arrays)
