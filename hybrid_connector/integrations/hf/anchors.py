"""Anchors: the hidden states entering each recurrent group, at sparse page-aligned positions.

**Layout** (``hybrid_connector.payload.layout.AnchorLayout``, re-exported here; built from the
geometry by ``layout.anchor_layout``): tokens are cut into pages of ``page`` tokens
(``config.anchor_page_size``). In each page ``[s, s + page)`` the anchor keeps the **last**
``keep = geometry.anchors.anchor_keep(geometry, page, rho)`` positions (rho =
``config.anchor_density``; at least ``(conv_kernel - 1) * L`` for the longest group L, so the
causal convs of a group continue exactly). Dense sampling next to the page end (rather than
uniform) follows SuffixReplay's finding that it is the more stable choice, and it makes the
positions just before a hit at the page end contiguous. One anchor block per page holds, per
recurrent group (``ModelGeometry.recurrent_groups()``, in order), the ``keep`` hidden states
entering the group's first layer: ``[groups, keep, hidden]`` in the model dtype, packed 1-D,
saved as ``SaveItem(ObjectKind.ANCHOR, s, s + page, payload)``; its size is
``geometry.anchors.anchor_block_bytes``, which the cache checks. The positions are a function
of ``(page, keep)``, which enter the cache fingerprint through ``layout``.

**Capture.** :class:`AnchorRecorder` puts forward pre-hooks on the group-entry decoder
layers; the runtime tells it the absolute position of each forward's first token. Each hook
gathers the kept positions of its forward straight into the page's payload with
``kernels.pack_anchors`` (a row gather, cast to the layout dtype). Pages are emitted once all
their kept positions have been seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybrid_connector import kernels
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.plan import SaveItem
from hybrid_connector.integrations.hf.state import decoder_layers
from hybrid_connector.payload.layout import AnchorLayout

__all__ = ["AnchorLayout", "AnchorRecorder"]


@dataclass
class _Page:
    """One page's anchor payload being filled: per group a ``[keep, hidden]`` part and which
    of its rows the hooks have written."""

    payload: torch.Tensor
    parts: dict[str, torch.Tensor]
    filled: torch.Tensor  # bool [groups, keep]


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
        self._pages: dict[int, _Page] = {}
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
        self._pages.clear()
        self._emitted.clear()

    def _page(self, start: int, device: torch.device) -> _Page:
        pg = self._pages.get(start)
        if pg is None:
            payload, parts = self.layout.payload.allocate(device)
            filled = torch.zeros((len(self.layout.groups), self.layout.keep), dtype=torch.bool)
            pg = self._pages[start] = _Page(payload, parts, filled)
        return pg

    def _hook(self, gi: int) -> Any:
        name = self.layout.payload.parts[gi].name

        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self._enabled:
                return
            h = args[0] if args else kwargs["hidden_states"]
            n = int(h.shape[1])
            page, keep = self.layout.page, self.layout.keep
            lo, hi = self._pos0, self._pos0 + n
            for s in range(lo - lo % page, hi, page):
                first = s + page - keep  # first kept position of the page
                a, b = max(lo, first), min(hi, s + page)
                if a >= b or s in self._emitted:
                    continue
                pg = self._page(s, h.device)
                kernels.pack_anchors(h[0].detach(), torch.arange(a - lo, b - lo),
                                     out=pg.parts[name][a - first : b - first])
                pg.filled[gi, a - first : b - first] = True
        return hook

    def pages(self, upto: int) -> list[SaveItem]:
        """SaveItems for the complete, not yet returned pages ending at or before ``upto``
        (pages whose kept positions were all captured). Frees their buffers."""
        out = []
        page = self.layout.page
        for end in range(page, upto + 1, page):
            start = end - page
            pg = self._pages.get(start)
            if start in self._emitted or pg is None or not bool(pg.filled.all()):
                continue
            del self._pages[start]
            out.append(SaveItem(ObjectKind.ANCHOR, start, end,
                                self.layout.payload.commit(pg.payload, pg.parts)))
            self._emitted.add(start)
        return out
