"""The head-to-head's runs of ours do not depend on how fast its worker's tier threads are:
after each engine step the runner waits for them (``run._drive``'s settle, what the peers'
stand-ins give by finishing every job in its step). Checked by holding every tier op of a
second run until someone calls ``Executor.flush``: its hits, recomputed tokens and bytes moved must equal those of
an unhindered run (before the settle, the held saves landed only at the end of the run and
later requests hit less)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybrid_connector.tiers.executor import Executor

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp: Path) -> list[Any]:
    from hybrid_connector.bench.vllm_peers import sweep as vp

    cfg = vp.PeersConfig(traces={"chat_edits": (16, 4)}, multiples=(1.0,), concurrency=2,
                         peers=("ours-pooled",))
    doc = vp.run_sweep(cfg, progress=False, work=tmp, configs=ROOT / "configs")
    (row,) = doc["rows"]
    return [row[k] for k in ("hit_tokens", "recomputed", "loaded_bytes", "stored_bytes")]


@pytest.fixture
def held_ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every op batch waits (on its lane) until ``flush`` is called (or a minute passes,
    so a run without settles still ends)."""
    go = threading.Event()
    submit, flush = Executor.submit, Executor.flush

    def held_submit(self: Executor, *a: Any, **kw: Any) -> Any:
        if not self.inline:
            self._lanes["local"].submit(go.wait, 60.0)
        return submit(self, *a, **kw)

    def releasing_flush(self: Executor, timeout: float | None = None) -> None:
        go.set()
        try:
            flush(self, timeout)
        finally:
            go.clear()

    monkeypatch.setattr(Executor, "submit", held_submit)
    monkeypatch.setattr(Executor, "flush", releasing_flush)
    yield
    go.set()


def test_a_run_of_ours_does_not_depend_on_its_worker_threads_speed(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    fast = _run(tmp_path / "fast")
    request.getfixturevalue("held_ops")
    slow = _run(tmp_path / "slow")
    assert slow == fast
    assert fast[0] > 0 and fast[2] > 0  # the connector served hits
