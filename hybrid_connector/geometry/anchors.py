"""The size rule of an anchor block: how many positions of a page it keeps, and its bytes.

One block per page of ``page`` tokens holds, per recurrent group, the hidden states entering
the group at the page's last ``anchor_keep`` positions (SuffixReplay's token-wise sparse
anchors; the tokens nearest the page boundary, which the paper finds most stable). This is
the one definition of an anchor block's size: the payload layout
(``hybrid_connector.payload.layout.anchor_layout``) packs to it, the index validates
payloads against it and the admission policy prices anchor pages with it.
"""

from __future__ import annotations

import math

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.geometry.model import ModelGeometry


def anchor_keep(geometry: ModelGeometry, page: int, density: float) -> int:
    """Positions one page's anchor block keeps: ``ceil(page * density)``, but at least
    ``(conv_kernel - 1) * L`` (L the longest recurrent group: the conv state of the j-th
    layer of a group is exact only when the last ``j * (kernel - 1)`` inputs of the group
    are contiguous) and at most ``page``. Raises ValueError for a bad page or density."""
    if page <= 0 or not 0 < density <= 1:
        raise ValueError(f"need page > 0 and 0 < density <= 1, got {page}, {density}")
    kernels = [d.conv_kernel for d in (geometry.mamba2, geometry.mamba1, geometry.gdn,
                                       geometry.short_conv) if d is not None]
    depth = max((len(g) for g in geometry.recurrent_groups()), default=1)
    min_keep = (max(kernels, default=1) - 1) * depth
    return min(page, max(1, min_keep, math.ceil(page * density)))


def anchor_block_bytes(geometry: ModelGeometry, page: int, density: float) -> int:
    """Bytes of one page's anchor block: ``anchor_keep`` positions times
    ``anchor_bytes_per_token``. Raises ValueError for a bad page or density."""
    return anchor_keep(geometry, page, density) * geometry.anchor_bytes_per_token()


def configured_anchors(config: HybridConfig) -> tuple[int, float]:
    """The ``(page, density)`` of anchor blocks under ``config``: ``anchor_page_size`` and
    ``anchor_density``, where a density of 0 means one position per page (before the conv
    minimum of :func:`anchor_keep`)."""
    page = config.anchor_page_size
    return page, (config.anchor_density or 1.0 / page)
