"""Launch-shape helpers shared by the CUDA wrappers."""

from __future__ import annotations

#: Grid-stride loops in every kernel make any grid correct; this bounds launch size.
MAX_GRID = 1 << 16


def grid(work_items: int) -> int:
    """Blocks for ``work_items`` independent rows/pages (one block per item, capped)."""
    return max(1, min(work_items, MAX_GRID))


def block(per_item: int) -> int:
    """Threads per block: a power of two in [32, 256] covering ``per_item`` lanes."""
    threads = 32
    while threads < per_item and threads < 256:
        threads *= 2
    return threads


def vector_width(*byte_quantities: int) -> int:
    """Widest vector (16, 4 or 1 bytes) that divides every address, stride and size."""
    for width in (16, 4):
        if all(q % width == 0 for q in byte_quantities):
            return width
    return 1
