"""Immutable values the ``HybridCache`` hands to engines: load plans, save items, results."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tree.radix import ObjectRef

SLOW_TIERS = frozenset({"disk", "remote"})


@dataclass(frozen=True, slots=True)
class PlannedObject:
    """One object to load: its ref and the tier that held it when the plan was made."""

    ref: ObjectRef
    tier: str


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What to load for a prompt; built by ``HybridCache.lookup`` without side effects.

    ``num_tokens`` is the usable hit length p (0 on a miss): KV for every attention layer
    over ``[0, p)`` (``kv`` chunks in order; the last may extend past p) and the recurrent
    state at exactly p: ``state`` (exact) or ``anchors`` to replay (``exact`` is False,
    ``replay_from`` is where replay starts). Always ``p < len(prompt)`` and a multiple of
    the alignment. ``kv_tokens`` is how far attention KV alone reaches (per-group hit for
    engines that can use a deeper attention hit), ``matched_tokens`` the raw radix match.
    ``is_async`` is True when some object sits in a slow tier (disk, remote).
    ``alignment`` is the granularity the hit length was rounded to. ``pending_tokens``
    (> ``num_tokens``) is the hit objects still being saved would give once they land (an
    engine may prefer to ask again later).
    """

    num_tokens: int
    exact: bool
    kv: tuple[PlannedObject, ...] = ()
    state: PlannedObject | None = None
    anchors: tuple[PlannedObject, ...] = ()
    replay_from: int = 0
    kv_tokens: int = 0
    matched_tokens: int = 0
    prompt_tokens: int = 0
    node_id: int = 0
    is_async: bool = False
    alignment: int = 1
    pending_tokens: int = 0

    @property
    def hit(self) -> bool:
        return self.num_tokens > 0

    @property
    def objects(self) -> tuple[PlannedObject, ...]:
        return (*self.kv, *((self.state,) if self.state else ()), *self.anchors)

    @property
    def nbytes(self) -> int:
        return sum(o.ref.nbytes for o in self.objects)


MISS = LoadPlan(num_tokens=0, exact=True)


@dataclass(frozen=True, slots=True)
class ObjectSpec:
    """An object to save, without its bytes (what the index needs): KV chunk
    ``[start, end)``, state at ``end`` (``start == end``) or anchor page ``[start, end)``,
    and its payload size per TP rank."""

    kind: ObjectKind
    start: int
    end: int
    nbytes: int

    def __init__(self, kind: ObjectKind, start: int, end: int, nbytes: int) -> None:
        # by hand, not the dataclass's: specs are made per chunk at every save
        put = object.__setattr__
        put(self, "kind", kind)
        put(self, "start", start)
        put(self, "end", end)
        put(self, "nbytes", nbytes)
        if kind is ObjectKind.STATE:
            if start != end:
                raise ValueError(f"a state item has start == end, got [{start}, {end})")
        elif not 0 <= start < end:
            raise ValueError(f"bad {kind.value} range [{start}, {end})")
        if nbytes <= 0:
            raise ValueError(f"an object has a positive size, got {nbytes}")


@dataclass(frozen=True, slots=True)
class SaveItem:
    """One object an engine hands over: KV chunk ``[start, end)``, state at ``end`` (with
    ``start == end``) or an anchor block for the page ``[start, end)``."""

    kind: ObjectKind
    start: int
    end: int
    payload: torch.Tensor

    def __post_init__(self) -> None:
        if self.kind is ObjectKind.STATE and self.start != self.end:
            raise ValueError(f"a state item has start == end, got [{self.start}, {self.end})")
        if self.kind is not ObjectKind.STATE and not 0 <= self.start < self.end:
            raise ValueError(f"bad {self.kind.value} range [{self.start}, {self.end})")
        if not isinstance(self.payload, torch.Tensor) or self.payload.numel() == 0:
            raise ValueError("payload must be a non-empty tensor")

    @property
    def spec(self) -> ObjectSpec:
        return ObjectSpec(self.kind, self.start, self.end,
                          self.payload.numel() * self.payload.element_size())


@dataclass(frozen=True, slots=True)
class Rejection:
    """One item ``save`` did not store, and why: ``outside`` (ends past the saved tokens),
    ``size`` (payload bytes differ from what the geometry says), ``page`` (an anchor block
    that is not one page of ``anchor_page_size``), ``too_large`` (bigger than any tier pool
    of its kind), ``no_room`` (no room even after evicting everything evictable now) or
    ``store`` (the store refused or lost it during the put)."""

    kind: ObjectKind
    start: int
    end: int
    reason: str


@dataclass(frozen=True, slots=True)
class SaveResult:
    """Outcome of ``HybridCache.save``: how many items were stored, already present or
    rejected (``rejections`` says which and why)."""

    stored: int
    present: int
    rejected: int
    evicted_bytes: int = 0
    rejections: tuple[Rejection, ...] = ()
    leaf: tuple[int, int] = (0, 0)  # where the save ended in the index (a later save's start)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Payloads for a plan. ``num_tokens`` is the usable hit after the reads: the plan's,
    or less when an object could not be read (the engine recomputes from there; see
    ``HybridCache.load``). ``kv`` holds the planned chunks read contiguously from the first
    one, in order (``kv_tokens``: how far they reach, capped at the plan's KV reach), also
    when the hit itself was lost; ``state``/``anchors`` are set only when the hit survived;
    ``failed`` lists every object that could not be read."""

    num_tokens: int
    exact: bool
    kv: tuple[torch.Tensor, ...] = ()
    state: torch.Tensor | None = None
    anchors: tuple[torch.Tensor, ...] = ()
    failed: tuple[ObjectRef, ...] = field(default_factory=tuple)
    kv_tokens: int = 0
