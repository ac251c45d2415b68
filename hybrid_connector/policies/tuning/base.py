"""What the Marconi policy needs from a tuner, whichever kind (``tuner``, ``shadow_tuner``).

A tuner sees every finished request (``record``), is told when the live cache first
evicts (``start``), and hands over a new setting at most once per decision (``poll``):
an alpha (``float``) or a ``Candidate`` (alpha and the refresh mode). It never touches
the live cache; ``close`` stops its threads and is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from hybrid_connector.core.keys import PrefixHasher


@dataclass(frozen=True)
class TunerRequest:
    """One recorded request: ``tokens`` = prompt + output, the first ``prompt_len`` the prompt.
    ``hasher(block_size)``: its prefix hashes, computed once however many twin caches serve
    it (not thread safe: one tuner worker steps them in turn); ``forget_hashes`` drops them
    once every twin has (a tuner's log keeps the tokens only)."""

    tokens: np.ndarray
    prompt_len: int
    _hashers: dict[int, PrefixHasher] = field(default_factory=dict, compare=False, repr=False)

    def hasher(self, block_size: int) -> PrefixHasher:
        got = self._hashers.get(block_size)
        if got is None:
            got = self._hashers[block_size] = PrefixHasher(self.tokens, block_size)
        return got

    def forget_hashes(self) -> None:
        self._hashers.clear()


class Candidate(NamedTuple):
    """One setting of the Marconi policy: its alpha, whether an access refreshes the whole
    path (SGLang-style) or only the last node (Marconi), and how recency and efficiency
    combine (``"sum"``: Marconi's; ``"product"``: ``marconi.product_utility``)."""

    alpha: float
    refresh_path: bool = False
    score: str = "sum"

    @property
    def label(self) -> str:
        return (f"{'x' if self.score == 'product' else ''}{self.alpha:g}"
                f"{'/path' if self.refresh_path else ''}")


LRU = Candidate(0.0, True)


class Tuner(Protocol):
    """The tuner interface ``MarconiEviction`` drives (see module docstring)."""

    started: bool

    def start(self, requests_seen: int) -> None: ...

    def record(self, tokens: np.ndarray, prompt_len: int) -> None: ...

    def poll(self) -> float | Candidate | None: ...

    def close(self) -> None: ...
