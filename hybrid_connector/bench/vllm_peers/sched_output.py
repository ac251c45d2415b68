"""The model runner's request bookkeeping for one ``SchedulerOutput``, as vLLM 0.33's GPU model
runner keeps it (``gpu_model_runner._update_states``): new requests get their block table and
computed count, cached ones their new blocks (or, resumed after a preemption, a whole new
block table and token list), finished ones are dropped. Shared by the head-to-head's runner
and the test harness, so both track requests exactly alike."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, Protocol, TypeVar


class TrackedRequest(Protocol):
    """What the bookkeeping reads and writes on a runner's request record."""

    tokens: list[int]
    block_ids: list[list[int]]
    computed: int

    def resumed(self) -> None:
        """Called after a preemption replaced the block table and the tokens (a runner
        drops what it derived from the old ones)."""


R = TypeVar("R", bound=TrackedRequest)


def apply_scheduler_output(so: Any, reqs: MutableMapping[str, R], new: Callable[[Any], R]) -> int:
    """Update ``reqs`` (request id -> record) for scheduler output ``so``: ``new(nr)`` makes
    the record of each ``NewRequestData``; a cached request's new block ids are appended per
    KV cache group, or, for a resumed one, replace its block table (its tokens become
    ``all_token_ids``' where vLLM sends them, then ``resumed()`` is called); every
    scheduled cached request's ``computed`` becomes vLLM's ``num_computed_tokens``;
    finished requests are removed. Returns how many requests were resumed."""
    for nr in so.scheduled_new_reqs:
        reqs[nr.req_id] = new(nr)
    cd = so.scheduled_cached_reqs
    resumed = 0
    for i, rid in enumerate(cd.req_ids):
        r = reqs[rid]
        if rid in cd.resumed_req_ids:  # after a preemption: a new block table
            resumed += 1
            r.block_ids = [list(b) for b in cd.new_block_ids[i]]
            r.tokens = list(cd.all_token_ids.get(rid, r.tokens))
            r.resumed()
        elif cd.new_block_ids[i] is not None:
            for g, ids in enumerate(cd.new_block_ids[i]):
                r.block_ids[g].extend(ids)
        r.computed = cd.num_computed_tokens[i]
    for rid in so.finished_req_ids:
        reqs.pop(rid, None)
    return resumed
