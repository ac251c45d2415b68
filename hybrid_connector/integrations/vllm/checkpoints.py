"""Which of the state boundaries vLLM offers the connector saves (``SchedulerSide.saves_for``).

vLLM offers the state at every retained block boundary it computes
(``boundary_state_offloads``); one state costs the host bytes of the KV of
``state_bytes / kv_bytes_per_token`` tokens (94 at Qwen3.5's geometry), so few are kept:

* admission's positions (Marconi's branch points, placement slots) over the prompt;
* without ``save_decode_cache`` (prompts stored only): also the last boundary of the
  computed prompt tokens, the deepest state a later turn can hit;
* with ``save_decode_cache`` (answers stored too): the exact end-of-request state
  (``SchedulerSide.finish_tail``) is what the next turn hits, so no boundary of generated
  tokens is forced (each would be superseded by the tail less than a block later), and
  admission is asked about the prompt only (asked about the answer, placement slots landed
  in every answer, at depths other sessions merely shared). The prompt's last boundary is
  kept only when it lies at least a block past the deepest hit the index gives there
  already (the first request of a shared prefix, a long new user message): after a stored
  answer that hit is the previous turn's tail, a few tokens short of it.

Measured in the head-to-head (chat trace, 2x host budget): forced answer boundaries, the
prompt's last boundary after a stored answer and placement slots in answers made 43% of
the states saved; without them the host tier keeps more sessions (token hit rate 0.801 ->
0.833).

Whether answers are stored at all is learnt per workload (``AnswerGate``, on
``policies.admission.answers.AnswerReuse``): with ``save_decode_cache`` a request stores its
answer while recent arrivals extended recorded answers; otherwise (a Mooncake-style trace,
outputs never return as inputs) it is saved as with prompts only.

A request whose answer is not stored and that finishes at its prompt's end (one generated
token: a prefill-only request) leaves the exact state there and the KV past the prompt's
last boundary (``finish_tail``), which only a later prompt extending that exact prompt can
hit. Whether such prompts come is learnt the same way (``PromptGate``, the same estimate
fed prompts): while few arrivals extend a recorded prompt past a non-aligned end (a
Mooncake-style trace, whose next turn drops the previous prompt's partial last block), the
save stops at the prompt's last boundary (``save_cap``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.policies.admission.answers import AnswerReuse
from hybrid_connector.runtime.progress import TokenBuffer

DECIDED = 65536  # requests whose decision is remembered (finished ones are forgotten at once)


def prompt_tokens(request: Any) -> np.ndarray:
    """``request``'s prompt tokens (a vLLM ``Request``), as int64."""
    return np.asarray(request.all_token_ids[: request.num_prompt_tokens], dtype=np.int64)


class AnswerGate:
    """Whether a vLLM request stores its answer (``stores``; ``save_decode_cache`` off:
    never). Decided once per request, at the first call, by ``AnswerReuse.decide`` after
    counting the request's prompt as an arrival (and, when it extends a stored answer,
    whether ``index`` still holds that answer's end-of-request state: its survival);
    ``finished`` records its answer (stored or not) and forgets the request. Bounded and
    deterministic; engine-core thread only."""

    def __init__(self, enabled: bool, index: CacheIndex | None = None,
                 reuse: AnswerReuse | None = None) -> None:
        self.enabled = enabled
        self.index = index
        self.reuse = reuse if reuse is not None else AnswerReuse()
        self._decided: dict[str, bool] = {}

    def stores(self, request: Any, prompt: Callable[[], np.ndarray] | None = None) -> bool:
        """Whether ``request`` (a vLLM ``Request``) saves KV and its end-of-request state past
        its prompt (``prompt``: gives its prompt tokens, asked only to decide)."""
        if not self.enabled:
            return False
        rid = request.request_id
        got = self._decided.get(rid)
        if got is None:
            toks = prompt() if prompt is not None else prompt_tokens(request)
            back = self.reuse.arrived(toks)
            if back is not None and back[1] and self.index is not None:
                # the tail sits at the request's last computed token: its last one is not
                plan = self.index.lookup(toks, alignment=1, replay=False)
                self.reuse.survived(max(plan.num_tokens, plan.pending_tokens) >= back[0] - 1)
            got = self._decided[rid] = self.reuse.decide()
            if len(self._decided) > DECIDED:
                del self._decided[next(iter(self._decided))]
        return got

    def finished(self, request: Any, tokens: np.ndarray) -> None:
        """``request`` finished with ``tokens`` (prompt + output): record its answer."""
        stored = self._decided.pop(request.request_id, False)
        if self.enabled:
            self.reuse.finished(tokens, request.num_prompt_tokens, stored)


class PromptGate:
    """Whether a vLLM request may save past its prompt's last block boundary (``exact``).
    Decided once per request, at the first call, by
    ``AnswerReuse.stores`` after counting the request's prompt as an arrival; a prompt that
    ends inside a block is then recorded (saved or not: a ghost). Bounded and
    deterministic; engine-core thread only."""

    def __init__(self, block: int, reuse: AnswerReuse | None = None) -> None:
        self.block = block
        self.reuse = reuse if reuse is not None else AnswerReuse()
        self._decided: dict[str, bool] = {}

    def exact(self, request: Any, prompt: Callable[[], np.ndarray] | None = None) -> bool:
        """Whether ``request`` (a vLLM ``Request``) may save up to its exact prompt end
        (``prompt``: gives its prompt tokens, asked only to decide)."""
        rid = request.request_id
        got = self._decided.get(rid)
        if got is None:
            p = request.num_prompt_tokens
            toks = prompt() if prompt is not None else prompt_tokens(request)
            self.reuse.arrived(toks)
            got = self._decided[rid] = self.reuse.stores
            if p % self.block:
                self.reuse.record(toks, got)
            if len(self._decided) > DECIDED:
                del self._decided[next(iter(self._decided))]
        return got

    def finished(self, request: Any) -> None:
        self._decided.pop(request.request_id, None)


def save_cap(answers: AnswerGate, prompts: PromptGate, request: Any, end: int,
             tokens: TokenBuffer) -> int:
    """How many of ``request``'s first ``end`` computed tokens may be saved: all while its
    answer is stored, else its prompt, cut to the last block boundary unless
    ``prompts.exact`` (asked first: every request counts as an arrival there). ``tokens``:
    the request's token buffer, where its prompt is read without converting vLLM's list."""
    # both gates decide at a request's first call: one prompt copy, made only then (a
    # closure, not functools.cache: this runs for every request at every saving step)
    made: list[np.ndarray] = []

    def copy() -> np.ndarray:
        if not made:
            made.append(tokens.view(request.all_token_ids,
                                    request.num_tokens)[: request.num_prompt_tokens])
        return made[0]

    exact = prompts.exact(request, copy)
    if answers.stores(request, copy):
        return end
    p = request.num_prompt_tokens
    return min(end, p if exact else p - p % prompts.block)


def wanted_states(index: CacheIndex, toks: np.ndarray, cap: int, prompt: int, block: int,
                  answers: bool, offered: list[int]) -> set[int]:
    """The positions among ``offered`` (block boundaries up to the computed tokens) worth a
    state, for a request whose first ``cap`` tokens may be saved (``cap`` <= ``prompt``
    unless ``answers``: ``save_decode_cache``), its ``prompt`` tokens long; ``toks``: its
    tokens so far. Asks the index (no side effects on it), see the module docstring."""
    if not answers:
        want = index.state_positions(toks[:cap], block)
        want.add(cap - cap % block)
        return want
    p = min(cap, prompt)
    want = index.state_positions(toks[:p], block)
    last = p - p % block
    if last in offered and last not in want:
        plan = index.lookup(toks[:last + 1], alignment=1, replay=False)
        if last - max(plan.num_tokens, plan.pending_tokens) >= block:
            want.add(last)
    return want


def never_wanted(offered: list[int], upto: int, prompt: int, answers: bool) -> list[int]:
    """Offers that no later step can want, once the first ``upto`` tokens are computed:
    boundaries of generated tokens (every position wanted lies inside the prompt), and with
    ``answers`` every offer once the prompt is computed (what is wanted no longer changes
    with the request's own tokens). Dropping them spares each decode step the index walk."""
    if answers and upto >= prompt:
        return list(offered)
    return [q for q in offered if q > prompt]
