"""Server mode end to end on a preset geometry: a second client hits on what the first
stored, every loaded byte is the one saved, through host and NVMe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from server_support import client_config, served, server_config

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.remote.client.server_cache import ServerCache
from hybrid_connector.runtime.session import RequestSession

GEO = get_preset("qwen3.5-0.8b")


def fill(kind: ObjectKind, start: int, end: int, nbytes: int) -> torch.Tensor:
    """Payload bytes that are a function of the object's identity."""
    g = torch.Generator().manual_seed(hash((kind.value, start, end)) & 0xFFFF_FFFF)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def turns(cache: ServerCache, n: int, seed: int = 0, history: np.ndarray | None = None
          ) -> tuple[list[tuple[int, bool]], np.ndarray]:
    """``n`` turns of one conversation continuing ``history``; returns (hit, every loaded
    byte verified) per turn and the conversation."""
    rng = np.random.default_rng(seed)
    history = np.zeros(0, dtype=np.int64) if history is None else history
    out = []
    for _ in range(n):
        prompt = np.r_[history, rng.integers(0, 1000, 600)]
        s = RequestSession(cache, prompt)
        loaded = s.load()
        ranges = [(o.ref.key.start, o.ref.key.end) for o in s.plan.kv]
        ok = all(torch.equal(t, fill(ObjectKind.KV, a, b, t.numel()))
                 for t, (a, b) in zip(loaded.kv, ranges, strict=True))
        if loaded.state is not None:
            p = s.plan.state.ref.key.end
            ok &= torch.equal(loaded.state, fill(ObjectKind.STATE, p, p, loaded.state.numel()))
        s.release()

        def kv(a: int, b: int) -> torch.Tensor:
            return fill(ObjectKind.KV, a, b, cache.expected_nbytes(ObjectKind.KV, a, b))

        def st(p: int) -> torch.Tensor:
            return fill(ObjectKind.STATE, p, p, cache.expected_nbytes(ObjectKind.STATE, p, p))

        s.save_prefill(kv, {q: st(q) for q in s.checkpoints})
        s.extend(rng.integers(0, 1000, 8))
        q = cache.final_checkpoint(len(s.tokens))
        s.finish(kv, {q: st(q)} if q else {})
        history = s.tokens
        out.append((s.hit, ok))
    return out, history


@pytest.mark.parametrize("disk", [False, True], ids=["host", "host+nvme"])
def test_second_client_hits_on_the_first_ones_objects(tmp_path: Path, disk: bool) -> None:
    cfg = server_config(tmp_path, host_mb=24 if disk else 256, disk_mb=512 if disk else 0)
    with served(cfg) as server:
        client = client_config(server.url, chunk_size=256)
        a = assemble.engine_cache(client, GEO)
        assert isinstance(a, ServerCache)
        first, history = turns(a, 3)
        a.close()
        b = assemble.engine_cache(client, GEO)
        second, _ = turns(b, 2, seed=1, history=history)  # continues the first's conversation
        b.close()
        stats = server.service.stats()
    assert first[0][0] == 0 and all(h > 0 for h, _ in first[1:])
    assert second[0][0] >= len(history) - 16  # hits on what the first client stored
    assert all(ok for _, ok in first + second)
    model = stats["models"][a.fingerprint]
    assert model["hits"] >= 4
    if disk:
        assert "nvme" in model["held"]


def test_embedded_and_server_mode_give_the_same_hits(tmp_path: Path) -> None:
    from hybrid_connector.core.config import load_config

    embedded = assemble.engine_cache(load_config(overrides={"chunk_size": 256,
                                                            "max_local_cpu_size": 0.25},
                                                 environ={}), GEO)
    want, _ = turns(embedded, 4)  # type: ignore[arg-type]
    embedded.close()
    with served(server_config(tmp_path, host_mb=256)) as server:
        remote = assemble.engine_cache(client_config(server.url, chunk_size=256), GEO)
        got, _ = turns(remote, 4)  # type: ignore[arg-type]
        remote.close()
    assert got == want


def test_warm_restart_serves_what_the_nvme_tier_holds(tmp_path: Path) -> None:
    """SIGTERM, then a new server process over the same NVMe directory: a new client's
    first request hits on the previous run's conversation (the index is re-linked from the
    objects' metadata at the model's first HELLO), every byte verified."""
    from server_support import ServerProcess

    cfg = server_config(tmp_path, host_mb=0, disk_mb=512)  # NVMe only: all of it persists
    with ServerProcess(cfg, tmp_path) as srv:
        a = assemble.engine_cache(client_config(srv.url, chunk_size=256), GEO)
        first, history = turns(a, 2)  # type: ignore[arg-type]
        a.close()
        assert srv.terminate() == 0
    with ServerProcess(cfg, tmp_path) as srv:
        b = assemble.engine_cache(client_config(srv.url, chunk_size=256), GEO)
        second, _ = turns(b, 1, seed=5, history=history)  # type: ignore[arg-type]
        b.check_integrity()  # type: ignore[union-attr]
        b.close()
    assert first[1][0] > 0 and second[0][0] >= len(history) - 16
    assert all(ok for _, ok in first + second)


def test_a_client_survives_a_server_restart_without_a_spurious_miss(tmp_path: Path) -> None:
    """Pooled connections die with the server; the next call retries once on a fresh one,
    so the first lookup after a restart is a hit, not a miss."""
    from server_support import ServerProcess

    cfg = server_config(tmp_path, host_mb=0, disk_mb=256)
    cfg["server"]["port"] = __import__("tier_servers").free_port()  # the same port twice
    with ServerProcess(cfg, tmp_path) as srv:
        client = assemble.engine_cache(client_config(srv.url, chunk_size=256), GEO)
        _, history = turns(client, 1)  # type: ignore[arg-type]
        srv.terminate()
    with ServerProcess(cfg, tmp_path):
        plan = client.lookup(np.r_[history, [1, 2, 3]])
        assert plan.hit and plan.num_tokens >= len(history) - 16
        client.close()
