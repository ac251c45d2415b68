"""Shared-prefix junctions from the whole index, handed to vLLM's chunk split.

In align mode vLLM writes a Mamba state only where a prefill chunk ends, so a branch point
inside one long chunk never gets a state and is never offered to a connector
(``boundary_state_offloads``). vLLM ends a chunk early at ``request.shared_prefix_boundary``
(``Scheduler._mamba_block_aligned_split``: a block-floored stop strictly inside the chunk),
which it sets from its device prefix cache alone (``get_computed_blocks``) just before it
asks the connector for its hit (``get_num_new_matched_tokens``), and keeps until the chunk
is split (it is reset only by a new lookup, or when a divergent local hit with no external
tokens is reconciled). The index knows branch points the device cache has forgotten: a
request whose tokens follow a stored path and leave it at J (the radix match of the
connector's own lookup, ``LoadPlan.matched_tokens``), past every state stored on that path,
is a sibling of the request that stored it, and the state at J is where the next sibling
would resume, when it is a branch (stored paths go on there by other tokens; a request
that merely extends a stored path past where its saves stop is no sibling). Setting the
junction to J from the connector's hit query makes vLLM end the chunk at J, retain that
block under sparse retention and offer its state; admission keeps it (the last boundary of
the step's computed tokens is always kept). vLLM's own junction, when past the hit, is kept.
Only the divergence point itself: positions an admission policy merely speculates on
(placement slots) are no junctions: forcing chunk stops there cost vLLM's own device cache
more hits than the states won (multiround_qa, 12 conversations of 3 rounds: 2,304 -> 2,016
hit tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.plan import LoadPlan


def junction(matched: int, *, hit: int, engine_junction: int, prompt_len: int,
             block: int) -> int:
    """The junction to hand vLLM, or 0 for none: where the request's tokens leave the
    index's stored paths (``matched``: the radix match, ``LoadPlan.matched_tokens``), floored
    to ``block`` (vLLM floors a junction to its block: a state inside a block is not
    cacheable there), when the request goes on past it inside its prompt (``matched <
    prompt_len``: a branch, not a prefix of a stored path), and the floored position lies
    strictly past the request's ``hit`` (where its first chunk starts: vLLM's local hit or
    the connector's, whichever is deeper). Never in place of vLLM's own ``engine_junction``
    when that lies past the hit: there is one junction per request, and vLLM's marks where
    its device cache holds KV without a state, which its own next hits need."""
    if block <= 0:
        raise ValueError(f"block must be positive, got {block}")
    if not 0 < matched < prompt_len or engine_junction > hit:
        return 0
    j = matched - matched % block
    return j if j > hit else 0


def branch_at(index: CacheIndex, tokens: np.ndarray) -> int:
    """Where ``tokens`` leave the index's stored paths when that is a branch: the radix
    match stops inside an edge or at a node with children (stored paths go on there by
    other tokens); 0 when the tokens extend a leaf (they continue a stored path past where
    its saves stop: no sibling diverged there) or match nothing. ``LoadPlan`` carries the
    match length but not which of the two it is, hence a second walk (rare: only when the
    match lies past the hit)."""
    with index.lock:
        m = index.tree.match(tokens)
        return m.length if m.partial is not None or m.node.children else 0


def offer_junction(index: CacheIndex, request: Any, tokens: np.ndarray, plan: LoadPlan,
                   num_computed: int, block: int) -> int:
    """Set ``request.shared_prefix_boundary`` (vLLM's ``Request``) to :func:`junction` at
    the request's branch from the stored paths (:func:`branch_at`); returns the junction
    set, 0 when none is (vLLM's own kept). Call it from
    ``get_num_new_matched_tokens`` (after vLLM's lookup set its own, before the split) with
    the connector's ``plan`` for ``tokens`` and vLLM's local hit ``num_computed``."""
    own = int(getattr(request, "shared_prefix_boundary", 0) or 0)
    n = int(request.num_prompt_tokens)
    hit = max(int(num_computed), plan.num_tokens)
    if not junction(plan.matched_tokens, hit=hit, engine_junction=own, prompt_len=n,
                    block=block):
        return 0  # the cheap test first: most requests hit where they leave the paths
    j = junction(branch_at(index, tokens[:n]), hit=hit, engine_junction=own, prompt_len=n,
                 block=block)
    if j:
        request.shared_prefix_boundary = j
    return j
