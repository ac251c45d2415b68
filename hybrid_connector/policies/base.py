"""Policy interfaces the ``HybridCache`` is built on.

An ``EvictionPolicy`` ranks nodes; the cache performs every mutation. An
``AdmissionPolicy`` decides where state checkpoints are worth taking for a request.
Policies may read the tree freely and write only ``Node.last_access``/``Node.hits`` and
their own private structures.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.tree.radix import MatchResult, Node, RadixTree

Evictable = Callable[[Node, ObjectKind], bool]


class EvictionPolicy(ABC):
    """Chooses which node gives up objects of a kind when that pool is full."""

    name = "base"

    def bind(self, tree: RadixTree, geometry: ModelGeometry, evictable: Evictable) -> None:
        """Called once by the cache. ``evictable(node, kind)`` tells whether the cache may
        evict ``kind`` from ``node`` right now (locks, structure)."""
        self.tree = tree
        self.geometry = geometry
        self.evictable = evictable

    @abstractmethod
    def on_access(self, path: Sequence[Node], now: float) -> None:
        """A hit or save used ``path`` (root-exclusive, deepest last) at logical time ``now``."""

    def on_change(self, node: Node) -> None:  # noqa: B027 - optional hook
        """``node`` gained or lost objects or children."""

    def on_remove(self, node_id: int) -> None:  # noqa: B027 - optional hook
        """The node with this id left the tree (removed or merged)."""

    def on_request(self, tokens: np.ndarray, prompt_len: int) -> None:  # noqa: B027 - optional
        """A request finished: ``tokens`` is prompt + output, the first ``prompt_len`` of
        them the prompt (feeds workload-adaptive policies such as the alpha tuner)."""

    @abstractmethod
    def next_victim(self, kind: ObjectKind) -> Node | None:
        """The node to evict ``kind`` from next, among nodes the cache marks evictable, or
        ``None`` when nothing is evictable. Must not mutate the tree."""

    def victim_kinds(self, kinds: Sequence[ObjectKind]) -> Sequence[ObjectKind]:
        """The order to try evicting ``kinds`` in when they share one budget (the first
        that yields a victim gives up bytes). Default: as given, the requested kind first.
        Must not mutate the tree."""
        return kinds

    def merits_demotion(self, node: Node, kind: ObjectKind) -> bool:
        """Whether an object evicted from a fast tier deserves a slower one."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the policy owns (threads, pools); the owning cache calls it from its
        own ``close``. Must be idempotent; the policy is not used afterwards."""


class SavePlan(NamedTuple):
    """Where a request should save objects while it is prefilled.

    ``state_positions``: checkpoint positions the admission policy wants (sorted).
    ``branch_point``: the raw speculative-insertion branch point (before alignment).
    ``kv_from``: first token position whose KV chunk is not cached yet.
    """

    state_positions: tuple[int, ...]
    branch_point: int | None
    kv_from: int


class AdmissionPolicy(ABC):
    """Decides which state checkpoints a request should produce."""

    name = "base"

    @abstractmethod
    def state_positions(
        self, tree: RadixTree, match: MatchResult, tokens: np.ndarray, alignment: int
    ) -> tuple[int, ...]:
        """Checkpoint positions (< len(tokens), multiples of ``alignment``) to take while
        prefilling ``tokens``, given the side-effect-free ``match`` of the prompt."""

    def admit_final(self, num_tokens: int) -> bool:
        """Whether the state after the last token of input+output is kept."""
        return True
