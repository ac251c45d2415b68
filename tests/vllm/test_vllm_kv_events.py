"""vLLM's KV cache events for what the connector's tiers hold, through vLLM 0.33.0's own
``Scheduler`` (which drains ``take_events`` every step and hands the batch to its publisher)
and its real ZMQ publisher. OffloadingConnector publishes its CPU and storage tiers this
way; before ``integrations/vllm/events.py`` ours published nothing, so a KV-aware router
never learned what our tiers could serve.

A router's view is rebuilt from the events alone (stores and removals counted per block
hash, group and medium) and must equal, at the end of a run with evictions and demotions to
NVMe, what the index can serve: every object whose end is a block boundary, under each
group it fills, in the medium of the tier it is read from."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402

from hybrid_connector.core.keys import ObjectKind  # noqa: E402

TIERED = """chunk_size: {chunk}
hash_block_size: 32
alignment: 32
local_disk: {dir}
max_local_disk_size: 8MB
disk_fsync: false
pools:
  host: {{kv: 48KB, state: 96KB}}
  disk: {{kv: 4MB, state: 4MB}}
replay: false
"""


class Capture:
    """Counts what vLLM's scheduler publishes, then passes it to the real publisher."""

    def __init__(self, publisher: Any) -> None:
        self.publisher, self.batches = publisher, []  # type: list[Any]

    def publish(self, batch: Any) -> None:
        self.batches.append(batch)
        self.publisher.publish(batch)

    def events(self) -> list[Any]:
        return [e for b in self.batches for e in b.events]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.publisher, name)


def _engine(root: Path, yaml_text: str, *, events: dict[str, Any] | None,
            extra: dict[str, Any] | None = None, chunk: int = 32
            ) -> tuple[Any, Any, h.Runner]:
    """``h.engine`` with vLLM's KV events configured as ``events`` (None: off)."""
    from vllm.config import KVEventsConfig

    def configure(vc: Any) -> None:
        if events is not None:
            vc.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, **events)

    return h.engine(root, yaml_text.format(dir=root / "nvme", chunk=chunk), retention=None,
                    num_blocks=16, name="events.yaml", extra=extra, configure=configure)


def _prompts(n: int, seed: int = 3) -> list[list[int]]:
    """Conversations that share a system prompt and grow turn by turn (hits, evictions)."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 128, 96).tolist()
    out = []
    for u in range(n):
        turn = system + rng.integers(0, 128, 40 + 7 * u).tolist()
        out += [turn, turn + rng.integers(0, 128, 50).tolist()]
    return out


def _serve(sched: Any, runner: h.Runner, prompts: list[list[int]], tag: str) -> list[Any]:
    reqs = [h.make_request(f"{tag}{i}", p, 3) for i, p in enumerate(prompts)]
    h.run(sched, runner, reqs, evict_every=2)
    h.idle(sched, runner, 6)
    return reqs


def _router(events: list[Any]) -> Counter[tuple[Any, int, str]]:
    """What a router holds after ``events``: (block hash, group, medium) -> stores not yet
    removed, of the connector's tiers. A removal of something never stored fails."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    held: Counter[tuple[Any, int, str]] = Counter()
    for e in events:
        if not isinstance(e, BlockStored | BlockRemoved) or e.medium == "GPU":
            continue  # vLLM's own device cache (its blocks, its clears)
        for bh in e.block_hashes:
            k = (bh, e.group_idx, e.medium)
            if isinstance(e, BlockStored):
                held[k] += 1
            else:
                assert isinstance(e, BlockRemoved)
                assert held[k] > 0, f"removal of {k} never stored"
                held[k] -= 1
    return +held


def _ext(h: bytes) -> Any:
    """A block hash as vLLM's events carry it (an int unless
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``)."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    return maybe_convert_block_hash(h)  # type: ignore[arg-type]


def _servable(side: Any, reqs: list[Any] | None = None) -> set[tuple[Any, int, str]]:
    """(block hash, group, medium) of every object the index may serve whose end is a
    block boundary: its vLLM block hash is the key's prefix hash; with ``reqs``, a KV chunk
    names every block it closes, from the request whose hashes hold its end."""
    from hybrid_connector.integrations.vllm.events import MEDIA

    ix, ev = side.index, side.events
    bs = ev.bs
    out = set()
    with ix.lock:
        for key in ix.table.placement():
            tier = ix.ledger.where(key) if ix.table.usable(key) else None
            if tier is None or key.end % bs:
                continue
            hashes = [key.prefix]
            if reqs is not None and key.kind is ObjectKind.KV:
                r = next(r for r in reqs if len(r.block_hashes) >= key.end // bs
                         and r.block_hashes[key.end // bs - 1] == key.prefix)
                first = key.start // bs + 1
                hashes = list(r.block_hashes[first - 1:key.end // bs])
            for g in ev.groups[key.kind]:
                out.update((_ext(bh), g, MEDIA[tier][0]) for bh in hashes)
    return out


def test_events_rebuild_what_the_tiers_can_serve(tmp_path: Path) -> None:
    sched, worker, runner = _engine(tmp_path, TIERED, events={"publisher": "null"})
    cap = sched.kv_event_publisher = Capture(sched.kv_event_publisher)
    side = sched.connector.sched
    try:
        _serve(sched, runner, _prompts(8), "r")
        evs = cap.events()
        stores = [e for e in evs if type(e).__name__ == "BlockStored" and e.medium != "GPU"]
        media = Counter(e.medium for e in stores)
        assert media["CPU"] and media["STORAGE"], media  # host and NVMe both announced
        assert any(type(e).__name__ == "BlockRemoved" for e in evs)  # evictions, moves
        held = _router(evs)
        assert set(held) == _servable(side)
        assert max(held.values()) == 1  # nothing announced twice
        groups = {e.group_idx for e in stores}
        attn = {g for g, _ in side.groups.attention}
        assert groups == attn | set(side.groups.recurrent_groups)
        kinds = {e.group_idx: e.kv_cache_spec_kind for e in stores}
        assert {kinds[g] for g in attn} == {"full_attention"}
        assert {kinds[g] for g in side.groups.recurrent_groups} == {"mamba"}
        # a reset (weights updated) removes everything announced
        assert sched.reset_prefix_cache(reset_connector=True)
        h.idle(sched, runner)
        assert not _router(cap.events())
    finally:
        worker.shutdown()
    assert runner.bad == []


def test_self_describing_events_carry_vllms_hashes_and_tokens(tmp_path: Path) -> None:
    sched, worker, runner = _engine(tmp_path, TIERED, events={"publisher": "null"},
                                    extra={"self_describing_kv_events": True}, chunk=64)
    cap = sched.kv_event_publisher = Capture(sched.kv_event_publisher)
    side = sched.connector.sched
    bs = side.groups.block_size
    try:
        reqs = _serve(sched, runner, _prompts(4), "d")
        evs = cap.events()
        stores = [e for e in evs if type(e).__name__ == "BlockStored" and e.medium != "GPU"]
        assert max(len(e.block_hashes) for e in stores) == 2  # a chunk names both its blocks
        for e in stores:
            n = len(e.block_hashes)
            assert e.block_size == bs and len(e.token_ids) == n * bs
            # some request has exactly these blocks: hashes, parent and tokens
            assert any(_holds(r, e, bs) for r in reqs), e
        # removals name the hashes their stores named; what is left is what is servable
        assert set(_router(evs)) == _servable(side, reqs)
    finally:
        worker.shutdown()
    assert runner.bad == []


def _holds(req: Any, e: Any, bs: int) -> bool:
    hashes = [_ext(x) for x in req.block_hashes]
    if e.block_hashes[0] not in hashes:
        return False
    i = hashes.index(e.block_hashes[0])
    n = len(e.block_hashes)
    return (hashes[i:i + n] == list(e.block_hashes)
            and e.parent_block_hash == (hashes[i - 1] if i else None)
            and list(req.all_token_ids[i * bs:(i + n) * bs]) == list(e.token_ids))


def test_events_go_through_vllms_zmq_publisher(tmp_path: Path) -> None:
    """The real transport: every batch the scheduler published is replayed by vLLM's
    ``ZmqEventPublisher`` and decodes as vLLM's ``KVEventBatch``."""
    import msgspec
    import zmq
    from vllm.distributed.kv_events import KVEventBatch

    sched, worker, runner = _engine(tmp_path, TIERED, events={
        "publisher": "zmq", "endpoint": f"ipc://{tmp_path}/pub",
        "replay_endpoint": f"ipc://{tmp_path}/replay"})
    pub = sched.kv_event_publisher
    cap = sched.kv_event_publisher = Capture(pub)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        _serve(sched, runner, _prompts(3), "z")
        assert cap.batches
        sock.connect(pub.get_publisher_config().replay_endpoint)
        dec = msgspec.msgpack.Decoder(KVEventBatch)
        got: list[Any] = []
        for _ in range(600):  # the publisher's thread sends what is queued; wait for all
            sock.send_multipart((b"", (0).to_bytes(8, "big")))
            got = []
            while True:
                assert sock.poll(10_000), "no replay from vLLM's publisher"
                _, _, seq, payload = sock.recv_multipart()
                if int.from_bytes(seq, "big", signed=True) < 0:
                    break
                got.append(dec.decode(payload))
            if len(got) >= len(cap.batches):
                break
            import time
            time.sleep(0.1)
        assert [b.events for b in got] == [b.events for b in cap.batches]
    finally:
        sock.close(linger=0)
        ctx.term()
        pub.shutdown()
        worker.shutdown()


def test_a_restart_announces_what_its_nvme_tier_kept(tmp_path: Path) -> None:
    """A router that lost the engine (it restarted) learns what the NVMe tier kept and the
    new engine adopted, without a request: from the first steps' events."""
    sched, worker, runner = _engine(tmp_path, TIERED, events={"publisher": "null"})
    _serve(sched, runner, _prompts(3), "a")
    worker.shutdown()
    sched.connector.shutdown()
    assert runner.bad == []
    sched, worker, runner = _engine(tmp_path, TIERED, events={"publisher": "null"})
    cap = sched.kv_event_publisher = Capture(sched.kv_event_publisher)
    try:
        h.idle(sched, runner)
        side = sched.connector.sched
        assert side.stats.restored  # adopted
        held = _router(cap.events())
        assert held and {m for _, _, m in held} == {"STORAGE"}
        assert set(held) == _servable(side)
    finally:
        worker.shutdown()


def test_no_events_unless_vllm_publishes_them(tmp_path: Path) -> None:
    sched, worker, runner = _engine(tmp_path, TIERED, events=None)
    side = sched.connector.sched
    try:
        _serve(sched, runner, _prompts(2), "n")
        assert side.events is None and side.index.table.changes is None
        assert list(sched.connector.take_events()) == []
        assert len(side.index.table) > 0  # it did store
        assert {k.kind for k in side.index.table.placement()} >= {ObjectKind.KV, ObjectKind.STATE}
    finally:
        worker.shutdown()
