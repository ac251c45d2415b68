"""Anchor retention: which anchor pages a request saves and what they cost.

SuffixReplay's token-wise sparse anchors: anchors live at page granularity
(``config.anchor_page_size``, 64 tokens), one block per page holding the last
``anchor_keep`` positions of the page (density ``rho`` = ``config.anchor_density``; the
tokens nearest the page boundary, which the paper finds most stable, and never fewer than
the causal convs of a group need to continue exactly) of one hidden state per recurrent
group (``ModelGeometry.anchor_bytes_per_token``). The size rule itself (``anchor_keep``,
``anchor_block_bytes``) is the geometry's (``hybrid_connector.geometry.anchors``), so the
payload layout packs to it without depending on policies; it is re-exported here for the
policies that price anchor pages.

Coupling to KV is lazy and one-way: a page's anchor block is saved only alongside KV the
request computed (never for loaded tokens, never before the page is complete), it hangs
on the radix node holding that KV, and it is dropped with that node; the cache never
evicts KV for anchor pressure, while KV eviction frees the node's anchors. Anchor pressure
evicts whole nodes' anchor blocks, least recently used first (``MarconiEviction`` for
``ObjectKind.ANCHOR``). Anchors produce hits only when ``config.replay`` is on; such hits
are approximate and labelled so.
"""

from __future__ import annotations

from hybrid_connector.geometry.anchors import anchor_block_bytes, anchor_keep

__all__ = ["anchor_block_bytes", "anchor_keep", "anchor_pages"]


def anchor_pages(computed_from: int, end: int, page: int) -> list[tuple[int, int]]:
    """Pages ``[s, s + page)`` (aligned from 0) lying fully inside ``[computed_from, end)``:
    the pages whose anchors a request that computed those tokens can save."""
    if page <= 0:
        raise ValueError(f"page must be positive, got {page}")
    first = -(-max(0, computed_from) // page) * page
    return [(s, s + page) for s in range(first, end - page + 1, page)]
