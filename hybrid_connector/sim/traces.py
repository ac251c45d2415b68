"""Trace records, JSONL I/O and deterministic synthetic trace generators.

A record is a dict with ``session_id``, ``turn_id``, ``ts`` (seconds), ``input_tokens`` and
``output_tokens`` (sequences of ints: lists, or 1-D int arrays with ``as_arrays=True``),
the Marconi reference simulator's JSONL format. Every generator is a pure function of its
arguments (``numpy.random.default_rng(seed)`` / ``random.Random(seed)``) and returns records
sorted by ``(ts, session_id, turn_id)``. Token ids are drawn uniformly from ``[3, vocab)``,
so unrelated content never shares a prefix beyond chance.

Generators (shapes no download can supply here; lengths follow the published statistics of
the datasets they imitate, see each docstring):

* ``multi_turn_chat``: LMSys/ShareGPT-like sessions growing turn by turn.
* ``agentic``: SWE-bench-like agent trajectories: a shared scaffold, long growing contexts,
  old tool observations collapsed (the reference keeps the last 5 in full), and retries
  that branch from an earlier turn.
* ``shared_document_qa``: questions over shared documents; some read only the first
  sections (a skewed overlap-depth distribution, where sparse placement matters).
* ``oneshot_chat`` (``traces_oneshot``): short hot prefixes shared by most requests, each
  followed by a long body seen once or twice, then never again.
* ``blog_agentic`` / ``blog_chat`` (``traces_blog``): the Marconi blog post's two traces,
  long prefixes reused ~20 times or once or twice, between hot short prefixes.
* ``system_prompts``: a few long system prompts in families sharing a common base, with
  Zipf-popular prompts and varied short queries.
* ``chat_edits`` / ``agentic_branch`` / ``multiround_qa`` (``traces_engine``) and
  ``mooncake`` (``traces_mooncake``): the engine head-to-head's traces (regenerations and
  edits, agents branching mid-turn with side calls, LMCache's multi-round QA, the public
  Mooncake format), with a ``scale`` length divisor.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybrid_connector.sim.trace_util import Record
from hybrid_connector.sim.trace_util import finish as _finish
from hybrid_connector.sim.trace_util import lognormal as _lognormal
from hybrid_connector.sim.trace_util import toks as _toks
from hybrid_connector.sim.traces_blog import blog_agentic, blog_chat
from hybrid_connector.sim.traces_engine import agentic_branch, chat_edits, multiround_qa
from hybrid_connector.sim.traces_mooncake import mooncake
from hybrid_connector.sim.traces_oneshot import oneshot_chat

REQUIRED = ("session_id", "turn_id", "ts", "input_tokens", "output_tokens")


# ------------------------------------------------------------------------------ chat
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
    lengths: str = "uniform",
    num_system_prompts: int = 1,
    max_input: int = 32768,
    as_arrays: bool = False,
) -> list[Record]:
    """Chat sessions; each turn's input is the whole history plus a new user message.

    ``lengths="uniform"``: user/output lengths uniform in the given ranges (the original
    small demo trace, unchanged for a given seed). ``lengths="sharegpt"``: lognormal user
    messages (mean 80 tokens, sigma 1.0) and replies (mean 280, sigma 0.8), the shape of
    ShareGPT/LMSys multi-turn sessions, and an inter-turn delay of reading the reply plus
    typing the next message at 90 words/min (1.33 tokens/word), as the reference traces do.
    Sessions start ``session_gap`` s apart and share one of ``num_system_prompts`` system
    prompts of ``system_prompt`` tokens. A session stops early once its input would exceed
    ``max_input`` tokens.
    """
    if num_sessions < 0 or turns < 0:
        raise ValueError("num_sessions and turns must be >= 0")
    if lengths not in ("uniform", "sharegpt"):
        raise ValueError(f"lengths must be 'uniform' or 'sharegpt', got {lengths!r}")
    rng = random.Random(seed)
    systems = [
        [rng.randrange(vocab) for _ in range(system_prompt)] for _ in range(max(1, num_system_prompts))
    ]
    nrng = np.random.default_rng(seed + 7919)
    out: list[Record] = []
    for s in range(num_sessions):
        history = list(systems[s % len(systems)])
        ts = s * session_gap
        for t in range(turns):
            if lengths == "uniform":
                user = [rng.randrange(vocab) for _ in range(rng.randint(*user_tokens))]
                reply = [rng.randrange(vocab) for _ in range(rng.randint(*output_tokens))]
            else:
                user = _toks(nrng, _lognormal(nrng, 80, 1.0, 4, 2048), vocab).tolist()
                reply = _toks(nrng, _lognormal(nrng, 280, 0.8, 8, 2048), vocab).tolist()
            inp = history + user
            if len(inp) > max_input:
                break
            out.append({"session_id": s, "turn_id": t, "ts": ts,
                        "input_tokens": inp, "output_tokens": reply})
            history = inp + reply
            if lengths == "uniform":
                ts += rng.expovariate(1.0 / think_time)
            else:  # read the reply and type the next message at 90 words/min
                ts += (len(reply) + len(user)) / 1.33 / 1.5 + nrng.exponential(5.0)
    if as_arrays:
        for r in out:
            r["input_tokens"] = np.asarray(r["input_tokens"], dtype=np.int64)
            r["output_tokens"] = np.asarray(r["output_tokens"], dtype=np.int64)
    return _finish(out, as_arrays)


# --------------------------------------------------------------------------- agentic
def agentic(
    num_sessions: int,
    turns: int,
    seed: int,
    scaffold_tokens: int = 2048,
    task_tokens: tuple[int, int] = (1000, 4000),
    observation_mean: int = 700,
    action_tokens: tuple[int, int] = (40, 300),
    keep_last: int = 5,
    collapsed_tokens: int = 24,
    retry_prob: float = 0.15,
    max_input: int = 32768,
    sessions_per_second: float = 0.5,
    mean_delay: float = 7.5,
    side_calls: float = 0.0,
    side_prompt_mean: int = 600,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """SWE-bench-like agent sessions (the reference's ``20240820_honeycomb`` shape).

    Every session starts with a shared ``scaffold_tokens`` agent prompt and its own task
    (uniform in ``task_tokens``). Each turn the agent emits an action (output, uniform in
    ``action_tokens``) and receives a tool observation (lognormal, mean
    ``observation_mean``, sigma 1.0, clipped to [16, 8192]). Observations older than the
    last ``keep_last`` are collapsed to their first ``collapsed_tokens`` tokens, so each
    turn's context diverges from the previous one inside the history (a branch point at a
    moving depth). With ``retry_prob`` the agent backtracks: it discards the last 1-3 turns
    and retries from there (a branch at an earlier depth). Sessions start
    ``1/sessions_per_second`` s apart; turns are Poisson with mean ``mean_delay`` s. A
    session ends after ``turns`` turns or when the input would exceed ``max_input``.

    ``side_calls`` (mean, Poisson) one-shot auxiliary requests follow each turn (a
    summariser or tool-formatting call, as agent frameworks issue): a shared 256-token
    auxiliary prompt plus a fresh lognormal body (mean ``side_prompt_mean``, sigma 0.6)
    and a short answer. They are recent but never reused: the mix where recency alone keeps
    the wrong entries and FLOPs per byte tells them apart.
    """
    if num_sessions < 0 or turns < 0 or not 0 <= retry_prob < 1:
        raise ValueError("num_sessions, turns >= 0 and retry_prob in [0, 1) required")
    rng = np.random.default_rng(seed)
    scaffold = _toks(rng, scaffold_tokens, vocab)
    aux = _toks(rng, 256, vocab)
    out: list[Record] = []
    for s in range(num_sessions):
        head = np.concatenate([scaffold, _toks(rng, rng.integers(*task_tokens, endpoint=True), vocab)])
        steps: list[tuple[np.ndarray, np.ndarray]] = []  # (action, observation)
        ts = s / sessions_per_second
        for t in range(turns):
            if steps and rng.random() < retry_prob:
                del steps[-int(rng.integers(1, min(3, len(steps)) + 1)):]
            parts = [head]
            for k, (act, obs) in enumerate(steps):
                parts.append(act)
                parts.append(obs if k >= len(steps) - keep_last else obs[:collapsed_tokens])
            inp = np.concatenate(parts)
            if inp.size > max_input:
                break
            action = _toks(rng, rng.integers(*action_tokens, endpoint=True), vocab)
            out.append({"session_id": f"agent-{s}", "turn_id": t, "ts": float(ts),
                        "input_tokens": inp, "output_tokens": action})
            obs = _toks(rng, _lognormal(rng, observation_mean, 1.0, 16, 8192), vocab)
            steps.append((action, obs))
            for c in range(int(rng.poisson(side_calls)) if side_calls > 0 else 0):
                body = _toks(rng, _lognormal(rng, side_prompt_mean, 0.6, 16, 8192), vocab)
                out.append({"session_id": f"agent-{s}-aux-{t}-{c}", "turn_id": 0,
                            "ts": float(ts + rng.uniform(0.1, 2.0)),
                            "input_tokens": np.concatenate([aux, body]),
                            "output_tokens": _toks(rng, rng.integers(16, 128, endpoint=True), vocab)})
            ts += rng.exponential(mean_delay)
    return _finish(out, as_arrays)


# ---------------------------------------------------------------- shared documents
def shared_document_qa(
    num_docs: int,
    num_questions: int,
    seed: int,
    doc_tokens: tuple[int, int] = (4000, 16000),
    section_tokens: int = 512,
    full_doc_prob: float = 0.5,
    depth_decay: float = 0.8,
    system_prompt: int = 128,
    question_tokens: tuple[int, int] = (16, 128),
    answer_tokens: tuple[int, int] = (16, 256),
    zipf_a: float = 1.2,
    rate: float = 2.0,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """Single-turn questions over shared documents (QuALITY/NarrativeQA-like).

    ``num_docs`` documents (uniform in ``doc_tokens``) of ``section_tokens`` sections; each
    question picks a document by Zipf(``zipf_a``) popularity and reads either all of it
    (``full_doc_prob``) or its first k sections with P(k) proportional to
    ``depth_decay**k`` (a skewed overlap-depth distribution), then asks a fresh question.
    Arrivals are Poisson at ``rate`` per second; every request is its own session.
    """
    if num_docs < 1 or num_questions < 0:
        raise ValueError("num_docs >= 1 and num_questions >= 0 required")
    rng = np.random.default_rng(seed)
    system = _toks(rng, system_prompt, vocab)
    docs = [_toks(rng, rng.integers(*doc_tokens, endpoint=True), vocab) for _ in range(num_docs)]
    pop = 1.0 / np.arange(1, num_docs + 1) ** zipf_a
    pop /= pop.sum()
    out: list[Record] = []
    ts = 0.0
    for q in range(num_questions):
        doc = docs[int(rng.choice(num_docs, p=pop))]
        nsec = max(1, doc.size // section_tokens)
        if rng.random() < full_doc_prob or nsec == 1:
            body = doc
        else:
            w = depth_decay ** np.arange(1, nsec)
            k = 1 + int(rng.choice(nsec - 1, p=w / w.sum()))
            body = doc[: k * section_tokens]
        inp = np.concatenate([system, body, _toks(rng, rng.integers(*question_tokens, endpoint=True), vocab)])
        ans = _toks(rng, rng.integers(*answer_tokens, endpoint=True), vocab)
        out.append({"session_id": f"qa-{q}", "turn_id": 0, "ts": float(ts),
                    "input_tokens": inp, "output_tokens": ans})
        ts += rng.exponential(1.0 / rate)
    return _finish(out, as_arrays)


# ------------------------------------------------------------------ system prompts
def system_prompts(
    num_families: int,
    num_queries: int,
    seed: int,
    variants_per_family: int = 4,
    base_tokens: tuple[int, int] = (1000, 3000),
    variant_tokens: tuple[int, int] = (200, 1500),
    query_tokens: tuple[int, int] = (8, 200),
    output_tokens: tuple[int, int] = (16, 400),
    zipf_a: float = 1.1,
    rate: float = 4.0,
    vocab: int = 32000,
    as_arrays: bool = False,
) -> list[Record]:
    """Single-turn queries behind long system prompts (the "System Prompts" dataset shape).

    ``num_families`` prompt families each have a common base (uniform in ``base_tokens``)
    and ``variants_per_family`` variants appending their own instructions (uniform in
    ``variant_tokens``): overlap depths cluster at the base end and the variant ends.
    Prompts are chosen by Zipf(``zipf_a``) popularity over all variants; queries and answers
    are fresh. Poisson arrivals at ``rate`` per second.
    """
    if num_families < 1 or variants_per_family < 1 or num_queries < 0:
        raise ValueError("num_families, variants_per_family >= 1 and num_queries >= 0 required")
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(num_families):
        base = _toks(rng, rng.integers(*base_tokens, endpoint=True), vocab)
        for _ in range(variants_per_family):
            prompts.append(np.concatenate([base, _toks(rng, rng.integers(*variant_tokens, endpoint=True), vocab)]))
    n = len(prompts)
    order = rng.permutation(n)  # popularity is not aligned with families
    pop = 1.0 / np.arange(1, n + 1) ** zipf_a
    pop /= pop.sum()
    out: list[Record] = []
    ts = 0.0
    for q in range(num_queries):
        prompt = prompts[int(order[int(rng.choice(n, p=pop))])]
        inp = np.concatenate([prompt, _toks(rng, rng.integers(*query_tokens, endpoint=True), vocab)])
        ans = _toks(rng, rng.integers(*output_tokens, endpoint=True), vocab)
        out.append({"session_id": f"sp-{q}", "turn_id": 0, "ts": float(ts),
                    "input_tokens": inp, "output_tokens": ans})
        ts += rng.exponential(1.0 / rate)
    return _finish(out, as_arrays)


GENERATORS = {
    "chat": multi_turn_chat,
    "agentic": agentic,
    "docqa": shared_document_qa,
    "sysprompt": system_prompts,
    "oneshot": oneshot_chat,
    "blog_agentic": blog_agentic,
    "blog_chat": blog_chat,
    "chat_edits": chat_edits,
    "agentic_branch": agentic_branch,
    "multiround_qa": multiround_qa,
    "mooncake": mooncake,
}


# ------------------------------------------------------------------------------ I/O
def validate(record: Any, where: str = "record") -> Record:
    """Check one record's fields and types; return it with token fields as int64 arrays.

    Raises ValueError naming ``where`` and the field for anything malformed.
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object, got {type(record).__name__}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    if not isinstance(record["ts"], int | float) or isinstance(record["ts"], bool):
        raise ValueError(f"{where}: field 'ts' must be a number, got {record['ts']!r}")
    if not isinstance(record["turn_id"], int) or isinstance(record["turn_id"], bool):
        raise ValueError(f"{where}: field 'turn_id' must be an integer")
    out = dict(record)
    for k in ("input_tokens", "output_tokens"):
        v = record[k]
        try:
            arr = np.asarray(v, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{where}: field {k!r} must be a list of integers") from None
        if arr.ndim != 1 or (arr.size and int(arr.min()) < 0):
            raise ValueError(f"{where}: field {k!r} must be a flat list of non-negative integers")
        if isinstance(v, list) and any(isinstance(x, bool) or not isinstance(x, int) for x in v):
            raise ValueError(f"{where}: field {k!r} must hold integers only")
        out[k] = arr
    if out["input_tokens"].size == 0:
        raise ValueError(f"{where}: field 'input_tokens' is empty")
    return out


def load_jsonl(path: str | os.PathLike[str]) -> list[Record]:
    """Read and validate a JSONL trace (token fields as int64 arrays), sorted by ts.
    Raises ValueError naming the file and line of the first bad record."""
    records = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not JSON: {exc.msg}") from None
            records.append(validate(obj, f"{path}:{i}"))
    records.sort(key=lambda r: (r["ts"], str(r["session_id"]), r["turn_id"]))
    return records


def save_jsonl(records: Iterable[Record], path: str | os.PathLike[str]) -> int:
    """Write records as JSONL (token arrays as lists); return how many were written."""
    n = 0
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            row = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


def summarize(records: Sequence[Record]) -> dict[str, float]:
    """Counts and mean lengths (for logs and the CLI)."""
    if not records:
        return {"requests": 0}
    ins = [len(r["input_tokens"]) for r in records]
    outs = [len(r["output_tokens"]) for r in records]
    return {
        "requests": len(records),
        "sessions": len({r["session_id"] for r in records}),
        "mean_input": float(np.mean(ins)),
        "max_input": float(max(ins)),
        "mean_output": float(np.mean(outs)),
        "input_tokens": float(sum(ins)),
    }
