"""One request's progress against a cache, in one record: what was planned and loaded,
what is saved, what is held. ``RequestSession`` (every engine driven through the session)
and the vLLM connector's scheduler side keep one per request, instead of one dictionary
per fact keyed by request id.

Two helpers keep per-step work proportional to what is new: ``TokenBuffer`` (the request's
tokens as one int64 array, grown in place, so tokens already seen are neither copied nor
re-validated) and ``progress.hashes`` (the engine's block hashes, extended in place).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hybrid_connector.core.hashes import EngineHashes
from hybrid_connector.core.keys import as_tokens
from hybrid_connector.index.plan import LoadPlan, LoadResult
from hybrid_connector.index.state import Lease


class TokenBuffer:
    """A request's tokens as a contiguous int64 array that only grows (engines append
    output tokens; the prompt never changes). ``view(source, n)`` copies only
    ``source[len:n]`` in and returns the first ``n`` tokens, a view whose positions are
    never written again (the index may keep slices of it). ``lift``: applied to the ids
    copied in (``lift(ids, first position)``), e.g. a vLLM request's namespace
    (``integrations.vllm.namespace``). Raises ValueError for negative token ids (checked
    once per token)."""

    __slots__ = ("_buf", "_n", "lift")

    def __init__(self, lift: Callable[[np.ndarray, int], np.ndarray] | None = None) -> None:
        self._buf = np.empty(0, dtype=np.int64)
        self._n = 0
        self.lift = lift

    def __len__(self) -> int:
        return self._n

    def view(self, source: Sequence[int], n: int) -> np.ndarray:
        if n > self._n:
            if n > self._buf.size:  # a new array: views already handed out keep the old one
                grown = np.empty(max(n, 2 * self._buf.size), dtype=np.int64)
                grown[: self._n] = self._buf[: self._n]
                self._buf = grown
            new = as_tokens(np.asarray(source[self._n : n], dtype=np.int64))  # ids >= 0
            if self.lift is not None:
                new = self.lift(new, self._n)
            self._buf[self._n : n] = new
            self._n = n
        return self._buf[:n]


@dataclass(slots=True, eq=False)
class RequestProgress:
    """Where one request stands (see the module docstring); positions are token counts.

    * ``plan``: the load planned for it, made when the engine held ``plan_base`` tokens
      (a lookup's result until it is loaded or dropped);
    * ``lease``: the cache's lock on what is being loaded (None once released);
    * ``loaded`` / ``hit``: what the load returned, and the prefix it made usable;
    * ``kv_saved``: first token whose KV is not saved (or queued) yet;
    * ``states_saved``: positions whose states are saved (or queued);
    * ``leaf``: where its last save ended (``SaveResult.leaf``, to resume hashing from);
    * ``tokens`` / ``hashes``: its tokens and the engine's block hashes seen so far.
    """

    request_id: str = ""
    plan: LoadPlan | None = None
    plan_base: int = 0
    lease: Lease | None = None
    loaded: LoadResult | None = None
    hit: int = 0
    kv_saved: int = 0
    states_saved: set[int] = field(default_factory=set)
    leaf: tuple[int, int] | None = None
    tokens: TokenBuffer = field(default_factory=TokenBuffer)
    hashes: EngineHashes | None = None

    def engine_hashes(self, block_size: int, block_hashes: Sequence[bytes],
                      tokens: np.ndarray) -> EngineHashes:
        """The engine's chained block hashes over ``tokens``: one ``EngineHashes`` per
        request, whose hash list grows by the blocks not seen before (each validated
        once)."""
        h = self.hashes
        if h is None or h.block_size != block_size or len(block_hashes) < len(h.hashes):
            h = self.hashes = EngineHashes(block_size, block_hashes, tokens)
            return h
        known = len(h.hashes)
        if len(block_hashes) > known:
            new = list(block_hashes[known:])
            if not all(isinstance(x, bytes) and x for x in new):
                raise ValueError("engine block hash is not non-empty bytes")
            h.hashes.extend(new)
        h.tokens = tokens
        return h
