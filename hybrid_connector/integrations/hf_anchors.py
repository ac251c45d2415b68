"""Anchors: the hidden states entering each recurrent group, at sparse page-aligned positions.

**Layout.** Tokens are cut into pages of ``page`` tokens (``config.anchor_page_size``). In
each page ``[s, s + page)`` the anchor keeps the **last** ``n = max(min_keep,
ceil(rho * page))`` positions ``[s + page - n, s + page)`` (rho = ``config.anchor_density``).
Dense sampling next to the page end (rather than uniform) follows SuffixReplay's finding
that it is the more stable choice, and it makes the positions just before a hit at the page
end contiguous, which the causal conv of the first layer of a group needs to be exact
(``min_keep`` is ``conv_kernel - 1``). One anchor block per page holds, per recurrent group
(``ModelGeometry.recurrent_groups()``, in order), the ``n`` hidden states entering the
group's first layer: ``[groups, n, hidden]`` in the model dtype, packed 1-D, saved as
``SaveItem(ObjectKind.ANCHOR, s, s + page, payload)``. The positions are a function of
``(page, rho)``, which enter the cache fingerprint through ``layout``.

**Capture.** :class:`AnchorRecorder` puts forward pre-hooks on the group-entry decoder
layers; the runtime tells it the absolute position of each forward's first token. Pages
are emitted once all their kept positions have been seen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybrid_connector.integrations.hf_pack import PartSpec, pack, unpack
from hybrid_connector.integrations.hf_state import decoder_layers
from hybrid_connector.keys import ObjectKind
from hybrid_connector.plan import SaveItem


@dataclass(frozen=True)
class AnchorLayout:
    """Which positions of a page are kept and how an anchor block is laid out."""

    page: int
    keep: int  # positions kept per page (the last ``keep`` of the page)
    groups: tuple[tuple[int, ...], ...]
    hidden: int
    dtype: torch.dtype

    @classmethod
    def build(cls, page: int, rho: float, groups: Sequence[Sequence[int]], hidden: int,
              dtype: torch.dtype, min_keep: int = 1) -> AnchorLayout:
        if page <= 0:
            raise ValueError(f"anchor page size must be > 0, got {page}")
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"anchor density must be in (0, 1], got {rho}")
        if not groups:
            raise ValueError("anchors need at least one recurrent group")
        keep = min(page, max(min_keep, math.ceil(rho * page)))
        return cls(page, keep, tuple(tuple(g) for g in groups), hidden, dtype)

    def positions(self, page_start: int) -> range:
        """Absolute token positions kept for the page starting at ``page_start``."""
        return range(page_start + self.page - self.keep, page_start + self.page)

    @property
    def specs(self) -> list[PartSpec]:
        return [PartSpec(f"group.{g[0]}", (self.keep, self.hidden), self.dtype) for g in self.groups]

    def pack(self, per_group: Sequence[torch.Tensor]) -> torch.Tensor:
        return pack(per_group, self.specs)

    def unpack(self, payload: torch.Tensor) -> list[torch.Tensor]:
        """Payload -> one ``[keep, hidden]`` tensor per group (ValueError if it does not fit)."""
        return unpack(payload, self.specs)

    def fingerprint(self) -> dict[str, object]:
        return {"anchor_page": self.page, "anchor_keep": self.keep}


class AnchorRecorder:
    """Collects anchor hidden states from forward passes of one request.

    Usage: ``rec.attach()`` once, then before each forward ``rec.start_at(pos)``; after it,
    ``rec.pages(upto)`` returns the SaveItems of complete pages ending at or before
    ``upto`` that were not returned before. ``detach()`` removes the hooks. Not thread
    safe: one recorder per running request.
    """

    def __init__(self, model: Any, layout: AnchorLayout) -> None:
        self.model = model
        self.layout = layout
        self._pos0 = 0
        self._enabled = True
        self._buf: list[dict[int, torch.Tensor]] = [{} for _ in layout.groups]
        self._emitted: set[int] = set()
        self._handles: list[Any] = []

    def attach(self) -> AnchorRecorder:
        layers = decoder_layers(self.model)
        for gi, group in enumerate(self.layout.groups):
            self._handles.append(layers[group[0]].register_forward_pre_hook(
                self._hook(gi), with_kwargs=True))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def start_at(self, pos: int, enabled: bool = True) -> None:
        """The next forward's first token is at absolute position ``pos``."""
        self._pos0 = pos
        self._enabled = enabled

    def reset(self) -> None:
        self._buf = [{} for _ in self.layout.groups]
        self._emitted.clear()

    def _hook(self, gi: int) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self._enabled:
                return
            h = args[0] if args else kwargs["hidden_states"]
            n = int(h.shape[1])
            page, keep = self.layout.page, self.layout.keep
            lo, hi = self._pos0, self._pos0 + n
            first = lo - lo % page
            buf = self._buf[gi]
            for s in range(first, hi, page):
                a = max(lo, s + page - keep)
                b = min(hi, s + page)
                if a < b:
                    chunk = h[0, a - lo : b - lo].detach().clone()  # not a view: frees h
                    for j in range(b - a):
                        buf[a + j] = chunk[j]
        return hook

    def pages(self, upto: int) -> list[SaveItem]:
        """SaveItems for the complete, not yet returned pages ending at or before ``upto``
        (pages whose kept positions were all captured). Frees their buffers."""
        out = []
        page = self.layout.page
        for end in range(page, upto + 1, page):
            start = end - page
            if start in self._emitted:
                continue
            pos = self.layout.positions(start)
            if not all(all(p in buf for p in pos) for buf in self._buf):
                continue
            per_group = [torch.stack([buf.pop(p) for p in pos]).to(self.layout.dtype)
                         for buf in self._buf]
            out.append(SaveItem(ObjectKind.ANCHOR, start, end, self.layout.pack(per_group)))
            self._emitted.add(start)
        return out
