"""The index's change feed (``StateTable.watch`` / ``take_changes``), what an engine's KV
events are built from (``integrations/vllm/events.py``): off by default; once watched, every
key whose residency may have changed is reported: saved (pending, then landed), removed, and
cleared."""

from __future__ import annotations

import numpy as np
from cache_support import make_cache, save_seq


def test_nothing_is_recorded_unless_watched() -> None:
    c = make_cache()
    save_seq(c, np.arange(40), states=[16, 40])
    assert c.index.table.changes is None and c.index.table.take_changes() == set()


def test_saves_and_a_clear_are_reported() -> None:
    c = make_cache()
    with c.index.lock:
        c.index.table.watch()
    save_seq(c, np.arange(40), states=[16, 40])
    with c.index.lock:
        saved = c.index.table.take_changes()
        held = set(c.index.where)
    assert saved and held <= saved  # every object now indexed was reported
    with c.index.lock:
        assert c.index.table.take_changes() == set()  # taken: reported once
        c.index.clear()
        c._run_drained()
        cleared = c.index.table.take_changes()
    assert held <= cleared and len(c.index.table) == 0
    c.check_integrity()
