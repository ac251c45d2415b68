"""Anchor retention: which anchor pages a request saves and what they cost.

SuffixReplay's token-wise sparse anchors: anchors live at page granularity
(``config.anchor_page_size``, 64 tokens), one block per page holding the last
``anchor_keep`` positions of the page (density ``rho`` = ``config.anchor_density``; the
tokens nearest the page boundary, which the paper finds most stable, and never fewer than
the causal convs of a group need to continue exactly) of one hidden state per recurrent
group (``ModelGeometry.anchor_bytes_per_token``). This is the one definition of an anchor
block's size: the cache validates payloads against it and the transformers runtime packs
to it.

Coupling to KV is lazy and one-way: a page's anchor block is saved only alongside KV the
request computed (never for loaded tokens, never before the page is complete), it hangs
on the radix node holding that KV, and it is dropped with that node; the cache never
evicts KV for anchor pressure, while KV eviction frees the node's anchors. Anchor pressure
evicts whole nodes' anchor blocks, least recently used first (``MarconiEviction`` for
``ObjectKind.ANCHOR``). Anchors produce hits only when ``config.replay`` is on; such hits
are approximate and labelled so.
"""

from __future__ import annotations

import math

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


def anchor_pages(computed_from: int, end: int, page: int) -> list[tuple[int, int]]:
    """Pages ``[s, s + page)`` (aligned from 0) lying fully inside ``[computed_from, end)``:
    the pages whose anchors a request that computed those tokens can save."""
    if page <= 0:
        raise ValueError(f"page must be positive, got {page}")
    first = -(-max(0, computed_from) // page) * page
    return [(s, s + page) for s in range(first, end - page + 1, page)]
