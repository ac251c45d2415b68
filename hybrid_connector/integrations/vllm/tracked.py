"""What the vLLM connector's scheduler side remembers of one request between vLLM's calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybrid_connector.runtime.progress import RequestProgress


@dataclass(slots=True, eq=False)
class Tracked(RequestProgress):
    """One vLLM request's progress (``RequestProgress``) and what vLLM told the connector
    about it: the ``Request`` itself, the state boundaries it offered (``offers``: position
    -> group -> block; ``open_offers``: those not saved yet), the exact blocks of its
    end-of-request state (``tail_blocks``), the tier of each external token
    (``sources``), whether the shared tier was searched for it (``discovered``)."""

    request: Any = None
    offers: dict[int, dict[int, int]] = field(default_factory=dict)
    open_offers: set[int] = field(default_factory=set)
    tail_blocks: dict[int, int] | None = None
    sources: dict[Any, int] | None = None
    discovered: bool = False
    gated: bool = False  # ``save_cap`` asked once: the gates' decisions are made

    def saved_states(self, positions: list[int]) -> None:
        self.states_saved.update(positions)
        self.open_offers.difference_update(positions)
