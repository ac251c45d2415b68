"""Traces for the engine head-to-head: chat with regenerations and edits, branching agents,
and LMCache's multi-round QA, each >= 1,000 requests with the CLI's default sizes.

Every generator is a pure function of its arguments and returns the records of
``traces`` (``session_id``, ``turn_id``, ``ts``, ``input_tokens``, ``output_tokens``), plus
``op``: what the request is (``new``, ``regen``, ``edit``, ``turn``, ``retry``,
``compact``, ``side``, ``round``). Structure (lengths, branch points, times) comes from one
generator seeded by ``seed``, token content from another, so ``scale`` (a divisor applied
to every length: ``scale=16`` for 2-core runs) changes the tokens but not the number,
order or kind of requests. Lengths are drawn at full size, then divided and rounded, at
least 1 token.

* ``chat_edits``: ShareGPT-shaped sessions (the lengths of ``traces.multi_turn_chat`` with
  ``lengths="sharegpt"``) where a request may regenerate the last answer (same input as the
  previous request, a new answer that replaces it) or edit an earlier user message (the
  conversation branches at the start of that turn and continues from the edit).
* ``agentic_branch``: agents over one shared scaffold (system prompt + tool schemas), each
  with its task, contexts growing by action + tool observation every turn (compacted to a
  summary past ``max_input``), retries that branch inside the last turn (the tool re-run
  agrees up to a point, then differs) and side calls (a short request sharing only the
  scaffold: a summariser, a classifier).
* ``multiround_qa``: LMCache's ``benchmarks/multi_round_qa/multi-round-qa.py`` workload:
  users join every ``gap * (rounds - 1) / concurrent_users`` s and ask ``num_rounds``
  questions ``gap = concurrent_users / qps`` s apart; the first prompt is the shared system
  prompt, a per-user header and context, then the question; each later round appends the
  answer (``answer_len`` tokens, the script's ``max_tokens``) and the next question.
  Defaults are the script's README command (10 users, 5 rounds, QPS 0.5, 1000/2000/100).
"""

from __future__ import annotations

import numpy as np

from hybrid_connector.sim.trace_util import Record, finish, lognormal


class _Tok:
    """Token content for lengths drawn at full size, divided by ``scale``."""

    def __init__(self, seed: int, scale: int, vocab: int) -> None:
        if scale < 1:
            raise ValueError("scale must be >= 1")
        self.rng = np.random.default_rng([seed, 1])
        self.scale, self.vocab = scale, vocab

    def __call__(self, n: int | np.integer) -> np.ndarray:
        k = max(1, int(round(int(n) / self.scale)))
        return self.rng.integers(3, self.vocab, size=k, dtype=np.int64)


def _rec(sid: str, turn: int, ts: float, inp: np.ndarray, out: np.ndarray, op: str) -> Record:
    return {"session_id": sid, "turn_id": turn, "ts": float(ts),
            "input_tokens": inp, "output_tokens": out, "op": op}


def chat_edits(
    num_sessions: int,
    turns: int,
    seed: int,
    system_prompt: int = 1024,
    num_system_prompts: int = 4,
    regen_prob: float = 0.12,
    edit_prob: float = 0.10,
    sessions_per_second: float = 0.25,
    scale: int = 1,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """``num_sessions`` sessions of exactly ``turns`` requests each (sessions start
    ``1/sessions_per_second`` s apart and share one of ``num_system_prompts`` system
    prompts). A session's first request is a new turn; each later one is, with
    ``regen_prob``, a regeneration (the previous input again, a new answer replacing the
    last), with ``edit_prob`` an edit (a new user message in place of the message of an
    earlier turn k, uniform over the turns so far; the turns from k on are dropped), else a
    new turn. User messages are lognormal (mean 80, sigma 1.0), answers lognormal (mean 280,
    sigma 0.8), and the next request follows after reading and typing at 90 words/min
    (a regeneration after a short exponential pause)."""
    if num_sessions < 0 or turns < 0 or regen_prob < 0 or edit_prob < 0 or regen_prob + edit_prob >= 1:
        raise ValueError("num_sessions, turns >= 0 and regen_prob + edit_prob in [0, 1) required")
    rng = np.random.default_rng([seed, 0])
    tok = _Tok(seed, scale, vocab)
    systems = [tok(system_prompt) for _ in range(max(1, num_system_prompts))]
    out: list[Record] = []
    for s in range(num_sessions):
        sysp = systems[int(rng.integers(len(systems)))]
        hist: list[tuple[np.ndarray, np.ndarray]] = []  # (user, answer) per kept turn
        ts = s / sessions_per_second
        for t in range(turns):
            u = rng.random() if hist else 1.0
            op = "regen" if u < regen_prob else "edit" if u < regen_prob + edit_prob else "new"
            n_user = 0  # full-size lengths: times do not depend on ``scale``
            if op == "regen":
                user = hist.pop()[0]
            else:
                if op == "edit":
                    del hist[int(rng.integers(len(hist))):]
                n_user = lognormal(rng, 80, 1.0, 4, 2048)
                user = tok(n_user)
            n_answer = lognormal(rng, 280, 0.8, 8, 2048)
            answer = tok(n_answer)
            inp = np.concatenate([sysp, *(x for pair in hist for x in pair), user])
            out.append(_rec(f"chat-{s}", t, ts, inp, answer, op))
            hist.append((user, answer))
            ts += (rng.exponential(3.0) if op == "regen"
                   else (n_answer + n_user) / 1.33 / 1.5 + rng.exponential(5.0))
    return finish(out, as_arrays)


def agentic_branch(
    num_sessions: int,
    turns: int,
    seed: int,
    scaffold_tokens: int = 4096,
    task_tokens: tuple[int, int] = (500, 3000),
    action_tokens: tuple[int, int] = (40, 300),
    observation_mean: int = 700,
    retry_prob: float = 0.15,
    side_calls: float = 0.5,
    side_body_mean: int = 400,
    max_input: int = 32768,
    summary_tokens: int = 2048,
    sessions_per_second: float = 0.1,
    mean_delay: float = 7.5,
    scale: int = 1,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """``num_sessions`` agents of ``turns`` turns each over one ``scaffold_tokens`` scaffold.

    Turn t sends the context (scaffold, the agent's task uniform in ``task_tokens``, then
    every earlier action and observation) and gets an action (uniform in
    ``action_tokens``); a tool observation follows (lognormal, mean ``observation_mean``,
    sigma 1.0, in [16, 8192]). With ``retry_prob`` the next turn's request is sent twice:
    the second time (``retry``) the last action + observation agree up to a point uniform
    inside them and continue differently (a flaky tool re-run, a repaired call), and the
    agent goes on from the retry. A context past ``max_input`` (full size) is compacted:
    the history becomes one ``summary_tokens`` summary (``compact``). Each turn is followed
    by Poisson(``side_calls``) side calls: the scaffold, a fresh body (lognormal, mean
    ``side_body_mean``, sigma 0.6) and a short answer, sharing nothing else. Agents start
    ``1/sessions_per_second`` s apart; turns are exponential with mean ``mean_delay`` s."""
    if num_sessions < 0 or turns < 0 or not 0 <= retry_prob < 1 or side_calls < 0:
        raise ValueError("num_sessions, turns, side_calls >= 0 and retry_prob in [0, 1) required")
    rng = np.random.default_rng([seed, 0])
    tok = _Tok(seed, scale, vocab)
    scaffold = tok(scaffold_tokens)
    cap = max_input / scale
    out: list[Record] = []
    for s in range(num_sessions):
        head = np.concatenate([scaffold, tok(rng.integers(*task_tokens, endpoint=True))])
        hist: list[np.ndarray] = []
        ts = s / sessions_per_second
        retry_next = False
        for t in range(turns):
            ctx = np.concatenate([head, *hist])
            op = "turn"
            if ctx.size > cap:
                hist, op = [tok(summary_tokens)], "compact"
                ctx = np.concatenate([head, *hist])
            elif retry_next:
                out.append(_rec(f"agent-{s}", 2 * t, ts, ctx, tok(rng.integers(*action_tokens, endpoint=True)), "turn"))
                last = hist.pop()
                cut = int(rng.integers(1, last.size)) if last.size > 1 else 0
                hist.append(np.concatenate([last[:cut], tok(lognormal(rng, observation_mean, 1.0, 16, 8192))]))
                ctx = np.concatenate([head, *hist])
                op, ts = "retry", ts + rng.exponential(mean_delay / 2)
            action = tok(rng.integers(*action_tokens, endpoint=True))
            out.append(_rec(f"agent-{s}", 2 * t + (op == "retry"), ts, ctx, action, op))
            obs = tok(lognormal(rng, observation_mean, 1.0, 16, 8192))
            hist.append(np.concatenate([action, obs]))
            retry_next = bool(rng.random() < retry_prob)
            for c in range(int(rng.poisson(side_calls))):
                body = tok(lognormal(rng, side_body_mean, 0.6, 16, 4096))
                out.append(_rec(f"agent-{s}-side-{t}-{c}", 0, ts + rng.uniform(0.1, 2.0),
                                np.concatenate([scaffold, body]),
                                tok(rng.integers(16, 128, endpoint=True)), "side"))
            ts += rng.exponential(mean_delay)
    return finish(out, as_arrays)


def multiround_qa(
    num_users: int,
    num_rounds: int,
    seed: int,
    concurrent_users: int = 10,
    qps: float = 0.5,
    system_prompt: int = 1000,
    user_info: int = 2000,
    answer_len: int = 100,
    question_tokens: int = 18,
    header_tokens: int = 12,
    scale: int = 1,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """``num_users`` users (over the whole trace; ``concurrent_users`` at a time, the
    script's ``--num-users``) of ``num_rounds`` rounds each, as LMCache's multi-round QA
    script issues them (module docstring). Every user's first prompt is the shared
    ``system_prompt``, a ``header_tokens`` header naming the user (where users diverge),
    ``user_info`` tokens of user context and a ``question_tokens`` question."""
    if num_users < 0 or num_rounds < 1 or concurrent_users < 1 or qps <= 0:
        raise ValueError("num_users >= 0, num_rounds >= 1, concurrent_users >= 1 and qps > 0 required")
    tok = _Tok(seed, scale, vocab)
    system = tok(system_prompt)
    gap = concurrent_users / qps
    join = gap * max(1, num_rounds - 1) / concurrent_users
    out: list[Record] = []
    for u in range(num_users):
        ctx = np.concatenate([system, tok(header_tokens), tok(user_info)])
        for r in range(num_rounds):
            ctx = np.concatenate([ctx, tok(question_tokens)])
            answer = tok(answer_len)
            out.append(_rec(f"user-{u}", r, u * join + r * gap, ctx, answer, "round"))
            ctx = np.concatenate([ctx, answer])
    return finish(out, as_arrays)
