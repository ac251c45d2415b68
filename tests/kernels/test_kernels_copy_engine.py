"""CopyEngine on CPU: readiness, ordering, cancellation, errors, shutdown."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from hybrid_connector import kernels
from hybrid_connector.tiers.copy_engine import (
    CopyEngine,
    LayerCancelledError,
    LayerTransfer,
    LayerTransferError,
)


def _slow_writer(dst: torch.Tensor, value: float, rng: random.Random) -> callable:  # type: ignore[valid-type]
    """A fetch that fills ``dst`` itself in pieces, sleeping in between, so a reader
    that is let through early sees a partly written tensor."""

    def fetch() -> None:
        pieces = dst.view(-1).split(max(1, dst.numel() // 4))
        for piece in pieces:
            time.sleep(rng.uniform(0, 0.004))
            piece.fill_(value)
        return None

    return fetch


def test_wait_observes_full_data_random_delays() -> None:
    rng = random.Random(0)
    layers = [torch.zeros(64, 32) for _ in range(24)]
    with CopyEngine(max_workers=4, device="cpu") as engine:
        for _ in range(3):
            for t in layers:
                t.zero_()
            job = engine.submit_layers(
                [LayerTransfer(f"l{i}", dst=t, fetch=_slow_writer(t, i + 1.0, rng)) for i, t in enumerate(layers)]
            )
            order = list(range(len(layers)))
            rng.shuffle(order)  # consumers may wait in any order
            for i in order:
                got = job.wait(f"l{i}", timeout=10)
                assert got is layers[i]
                assert bool((got == i + 1.0).all()), f"layer {i} reported ready before its data landed"
            job.wait_all(timeout=10)
            assert job.done() and not job.errors()
            assert set(job.status().values()) == {"landed"}


def test_fetch_returning_source_is_copied_and_post_runs_after() -> None:
    seen: list[str] = []
    staging = [torch.full((8,), float(i)) for i in range(5)]
    dsts = [torch.zeros(8) for _ in range(5)]

    def fetch(i: int):  # type: ignore[no-untyped-def]
        return lambda: (time.sleep(0.002 * (5 - i)), staging[i])[1]

    def post(i: int):  # type: ignore[no-untyped-def]
        def run(landed: torch.Tensor) -> None:
            assert landed is dsts[i] and bool((landed == i).all())  # post sees landed data
            seen.append(f"l{i}")

        return run

    with CopyEngine(max_workers=2, device="cpu") as engine:
        job = engine.submit_layers(
            [LayerTransfer(f"l{i}", dst=dsts[i], fetch=fetch(i), post=post(i)) for i in range(5)]
        )
        job.wait_all(timeout=10)
        src_job = engine.submit_layers([LayerTransfer("direct", dst=torch.zeros(8), src=staging[3])])
        assert bool((src_job.wait("direct", timeout=10) == 3).all())
        no_dst = engine.submit_layers([LayerTransfer("raw", fetch=lambda: staging[2])])
        assert no_dst.wait("raw", timeout=10) is staging[2]
    assert sorted(seen) == [f"l{i}" for i in range(5)]


def test_single_worker_lands_in_submission_order() -> None:
    landed: list[int] = []
    lock = threading.Lock()

    def fetch(i: int):  # type: ignore[no-untyped-def]
        def run() -> torch.Tensor:
            time.sleep(random.Random(i).uniform(0, 0.003))
            with lock:
                landed.append(i)
            return torch.full((4,), float(i))

        return run

    with CopyEngine(max_workers=1, device="cpu") as engine:
        job = engine.submit_layers([LayerTransfer(str(i), dst=torch.zeros(4), fetch=fetch(i)) for i in range(12)])
        job.wait_all(timeout=10)
    assert landed == list(range(12))


def test_error_mid_transfer_cancels_later_layers() -> None:
    def fetch(i: int):  # type: ignore[no-untyped-def]
        def run() -> torch.Tensor:
            if i == 3:
                raise OSError("nvme read failed")
            return torch.full((4,), float(i))

        return run

    with CopyEngine(max_workers=1, device="cpu") as engine:
        dsts = [torch.zeros(4) for _ in range(8)]
        job = engine.submit_layers([LayerTransfer(f"l{i}", dst=dsts[i], fetch=fetch(i)) for i in range(8)])
        for i in range(3):
            assert bool((job.wait(f"l{i}", timeout=10) == i).all())
        with pytest.raises(LayerTransferError, match="l3") as info:
            job.wait("l3", timeout=10)
        assert isinstance(info.value.__cause__, OSError)
        for i in range(4, 8):
            with pytest.raises(LayerCancelledError):
                job.wait(f"l{i}", timeout=10)
        assert list(job.errors()) == ["l3"]
        assert job.done()
        with pytest.raises(LayerTransferError):
            job.wait_all(timeout=10)


def test_error_mid_transfer_keeps_delivering_when_asked() -> None:
    def fetch(i: int):  # type: ignore[no-untyped-def]
        def run() -> torch.Tensor:
            if i == 2:
                raise ValueError("corrupt object")
            return torch.full((4,), float(i))

        return run

    with CopyEngine(max_workers=2, device="cpu") as engine:
        job = engine.submit_layers(
            [LayerTransfer(f"l{i}", dst=torch.zeros(4), fetch=fetch(i)) for i in range(6)],
            cancel_on_error=False,
        )
        for i in (0, 1, 3, 4, 5):
            assert bool((job.wait(f"l{i}", timeout=10) == i).all())
        with pytest.raises(LayerTransferError):
            job.wait("l2", timeout=10)
        # a bad copy (shape mismatch) is a per-layer failure too
        bad = engine.submit_layers([LayerTransfer("bad", dst=torch.zeros(3), src=torch.zeros(4))])
        with pytest.raises(LayerTransferError, match="bad"):
            bad.wait("bad", timeout=10)


def test_cancel_stops_pending_layers_and_running_one_still_lands() -> None:
    gate = threading.Event()
    started = threading.Event()

    def blocking() -> torch.Tensor:
        started.set()
        assert gate.wait(10)
        return torch.ones(4)

    with CopyEngine(max_workers=1, device="cpu") as engine:
        first = torch.zeros(4)
        transfers = [LayerTransfer("l0", dst=first, fetch=blocking)]
        transfers += [LayerTransfer(f"l{i}", dst=torch.zeros(4), fetch=lambda: torch.ones(4)) for i in range(1, 6)]
        job = engine.submit_layers(transfers)
        assert started.wait(10)
        assert job.cancel() == 5
        with pytest.raises(TimeoutError):
            job.wait("l0", timeout=0.05)  # still running: times out, does not hang
        assert not job.done()
        gate.set()
        assert bool((job.wait("l0", timeout=10) == 1).all())
        for i in range(1, 6):
            with pytest.raises(LayerCancelledError):
                job.wait(f"l{i}", timeout=1)
        assert job.done() and not job.errors()
        assert job.status()["l1"] == "cancelled"


def test_close_cancels_pending_work_and_wakes_waiters() -> None:
    gate = threading.Event()
    engine = CopyEngine(max_workers=1, device="cpu")
    job = engine.submit_layers(
        [LayerTransfer("l0", dst=torch.zeros(2), fetch=lambda: (gate.wait(10), torch.ones(2))[1])]
        + [LayerTransfer(f"l{i}", dst=torch.zeros(2), fetch=lambda: torch.ones(2)) for i in range(1, 4)]
    )
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            job.wait("l3", timeout=10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    th = threading.Thread(target=waiter)
    th.start()
    closer = threading.Thread(target=engine.close)
    closer.start()
    time.sleep(0.05)
    gate.set()
    closer.join(10)
    th.join(10)
    assert not closer.is_alive() and not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], LayerCancelledError)
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit_layers([LayerTransfer("x", dst=torch.zeros(1), src=torch.zeros(1))])


def test_bad_submissions_raise() -> None:
    with CopyEngine(max_workers=1, device="cpu") as engine:
        t = torch.zeros(2)
        with pytest.raises(ValueError, match="unique"):
            engine.submit_layers([LayerTransfer("a", dst=t, src=t), LayerTransfer("a", dst=t, src=t)])
        with pytest.raises(ValueError, match="exactly one"):
            engine.submit_layers([LayerTransfer("a", dst=t, src=t, fetch=lambda: t)])
        with pytest.raises(ValueError, match="exactly one"):
            engine.submit_layers([LayerTransfer("a", dst=t)])
        with pytest.raises(ValueError, match="needs a dst"):
            engine.submit_layers([LayerTransfer("a", src=t)])
        job = engine.submit_layers([LayerTransfer("a", dst=t, src=torch.ones(2))])
        with pytest.raises(KeyError, match="no layer named"):
            job.wait("b")
        none_fetch = engine.submit_layers([LayerTransfer("n", fetch=lambda: None)])
        with pytest.raises(LayerTransferError, match="no dst"):
            none_fetch.wait("n", timeout=10)
    with pytest.raises(ValueError):
        CopyEngine(max_workers=0, device="cpu")


def test_layerwise_kv_load_with_scatter_post() -> None:
    """The integration pattern: fetch a chunk buffer per layer, scatter it into the
    layer's paged KV cache in ``post``, consume layer by layer."""
    rng = random.Random(5)
    n_layers, nb, bs, h, d = 6, 10, 16, 2, 8
    caches = [torch.zeros(2, nb, bs, h, d, dtype=torch.bfloat16) for _ in range(n_layers)]
    chunks = [torch.randn(2, 3, bs, h, d).to(torch.bfloat16) for _ in range(n_layers)]
    ids = [9, 0, 4]

    def fetch(i: int):  # type: ignore[no-untyped-def]
        def run() -> torch.Tensor:
            time.sleep(rng.uniform(0, 0.003))
            return chunks[i].clone()

        return run

    def post(i: int):  # type: ignore[no-untyped-def]
        return lambda landed: kernels.scatter_kv_blocks(caches[i], ids, landed)

    with CopyEngine(max_workers=3, device="cpu") as engine:
        job = engine.submit_layers([LayerTransfer(f"attn{i}", fetch=fetch(i), post=post(i)) for i in range(n_layers)])
        for i in range(n_layers):
            job.wait(f"attn{i}", timeout=10)
            assert torch.equal(kernels.gather_kv_blocks(caches[i], ids), chunks[i])
