"""SGLang against our cache server by configuration: two HiCache backends (two SGLang
instances of one model, SGLang 0.5.23's real storage module and factory) with no local
tier and ``remote_url: lm://<our server>`` share the server's tiers: the second hits on the
first's pages, bytes included, and the MAMBA pool's states sit in the server's state pool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sglang"))

from server_support import served, server_config  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import count_pool_hits  # noqa: E402
from sglang_helpers import (  # noqa: E402
    PAGE,
    dynamic_backend,
    kv_bytes,
    kv_transfer,
    page_hashes,
    pools,
    register,
    slot_bytes,
    state_transfer,
)


def test_two_sglang_instances_share_our_server(tmp_path: Path) -> None:
    with served(server_config(tmp_path, host_mb=0, disk_mb=64)) as server:
        over = {"local_cpu": False, "remote_url": f"lm://127.0.0.1:{server.port}",
                "pools": {"remote": {"kv": "8MB", "state": "8MB"}}}
        writer, reader = dynamic_backend(over, model="srv"), dynamic_backend(over, model="srv")
        kv, mamba = pools()
        register(writer, kv, mamba)
        kv2, mamba2 = pools(seed=9)
        register(reader, kv2, mamba2)
        hashes = page_hashes(list(range(500, 500 + 4 * PAGE)))
        res = writer.batch_set_v2([state_transfer(hashes[-1], 0), kv_transfer(hashes, 0)])
        assert count_pool_hits(res) == {"kv": 4, "mamba": 1}
        hit = reader.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)])
        assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (4, [4])
        got = reader.batch_get_v2([kv_transfer(hashes, 8), state_transfer(hashes[-1], 3)])
        assert count_pool_hits(got) == {"kv": 4, "mamba": 1}
        assert kv_bytes(kv2, 8, 4) == kv_bytes(kv, 0, 4)
        assert slot_bytes(mamba2, 3) == slot_bytes(mamba, 0)
        held = server.service.stats()["plain"]["held"]
        kinds = {kind: n for model in held.values() for t in model.values()
                 for kind, (n, _) in t.items()}
        assert kinds == {"kv": 4, "state": 1}
        for b in (writer, reader):
            b.close()
