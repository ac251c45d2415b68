"""Lookup latency while another thread saves 50 MB states to NVMe and to a slow remote.

A cache with a host tier, an NVMe tier (fsync on) and a shared remote (a real
``redis-server`` behind a proxy that delays every reply by ``--delay-ms``, 200 by default)
holds a 32K-token prompt. The main thread looks it up over and over (p50/p99 latency);
first idle, then while a second thread saves one new 50 MB checkpoint after another
(Qwen3.5-4B's state size), each written to the host, demoted to NVMe and written through to
the remote. Two executors are compared in the same run: the default one (tier I/O on its
lanes, off the index's lock) and ``inline`` (tier I/O in the saving thread under the
index's lock: how saves behaved before core v2). Target: p99 while saving <= 2x idle.

Usage: ``python benchmarks/lookup_while_saving.py [--quick]``; needs ``redis-server``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hybrid_connector import assemble  # noqa: E402
from hybrid_connector.core.config import load_config  # noqa: E402
from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.geometry.model import ModelGeometry  # noqa: E402
from hybrid_connector.geometry.presets import get_preset  # noqa: E402
from hybrid_connector.index.plan import SaveItem  # noqa: E402
from hybrid_connector.tiers.host import HostTier  # noqa: E402
from hybrid_connector.tiers.manager import TieredStore  # noqa: E402
from hybrid_connector.tiers.nvme import NvmeTier  # noqa: E402
from hybrid_connector.tiers.remote.tier import RemoteTier  # noqa: E402

CHUNK = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DelayProxy:
    """TCP proxy: client bytes go straight on, each chunk of the server's reply waits
    ``delay`` seconds (a remote that answers in ``delay``)."""

    def __init__(self, upstream: int, delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pipe, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.delay), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, delay: float) -> None:
        try:
            while data := src.recv(1 << 20):
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.sock.close()


def geometry() -> ModelGeometry:
    """Qwen3.5-4B's 49 MiB checkpoint with a tiny attention (the KV of the 32K-token
    prompt stays small; lookups cost the same whatever the KV bytes)."""
    d = get_preset("qwen3.5-4b").to_dict()
    d["attention"] = {**d["attention"], "num_kv_heads": 1, "head_dim": 8, "num_heads": 8}
    return ModelGeometry.from_dict(d)


def run(inline: bool, delay: float, lookups: int, saves: int, url: str, root: Path) -> dict:
    geo = geometry()
    sb, kvb = geo.state_bytes(), geo.kv_bytes_per_token()
    cfg = load_config(overrides={"chunk_size": CHUNK, "hash_block_size": 16, "alignment": 16},
                      environ={})
    kinds = {ObjectKind.KV: 64 * 2**20, ObjectKind.STATE: 3 * sb}
    tiers = [HostTier(kinds), NvmeTier(root, {ObjectKind.KV: 2**30, ObjectKind.STATE: 8 * sb},
                                       fsync=True),
             RemoteTier(url, {ObjectKind.KV: 2**30, ObjectKind.STATE: 2**34}, timeout=30.0)]
    cache = assemble.cache(cfg, geo, TieredStore(tiers, inline=inline))
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 150_000, 32768).astype(np.int64)
    for s in range(0, prompt.size, CHUNK):
        cache.save(prompt[: s + CHUNK], [SaveItem(ObjectKind.KV, s, s + CHUNK,
                                                  torch.zeros((CHUNK * kvb,), dtype=torch.uint8))])
    cache.save(prompt, [SaveItem(ObjectKind.STATE, 32000, 32000, torch.zeros(sb, dtype=torch.uint8))])
    query = np.r_[prompt, [7]]
    assert cache.lookup(query).num_tokens == 32000

    def measure(n: int) -> np.ndarray:
        out = np.empty(n)
        for i in range(n):
            t = time.perf_counter()
            cache.lookup(query)
            out[i] = time.perf_counter() - t
        return out

    measure(20)
    idle = measure(lookups)
    stop = threading.Event()
    done = [0]

    def saver() -> None:
        state = torch.ones(sb, dtype=torch.uint8)
        for i in range(saves):
            if stop.is_set():
                return
            toks = np.r_[[10**6 + i], rng.integers(0, 1000, 47)].astype(np.int64)
            cache.save(toks, [SaveItem(ObjectKind.KV, 0, 48, torch.zeros(48 * kvb, dtype=torch.uint8)),
                              SaveItem(ObjectKind.STATE, 48, 48, state)])
            done[0] += 1

    th = threading.Thread(target=saver, daemon=True)
    t0 = time.perf_counter()
    th.start()
    time.sleep(0.05)
    busy = []
    while th.is_alive():
        busy.append(measure(10))
    stop.set()
    th.join()
    wall = time.perf_counter() - t0
    cache.close()
    busy_arr = np.concatenate(busy) if busy else np.zeros(1)
    p = lambda a, q: float(np.percentile(a, q) * 1e3)  # noqa: E731
    return {"executor": "inline (v1-style)" if inline else "lanes (v2)",
            "idle_p50_ms": p(idle, 50), "idle_p99_ms": p(idle, 99),
            "busy_p50_ms": p(busy_arr, 50), "busy_p99_ms": p(busy_arr, 99),
            "busy_max_ms": float(busy_arr.max() * 1e3), "busy_lookups": int(busy_arr.size),
            "p99_ratio": p(busy_arr, 99) / p(idle, 99), "saves": done[0],
            "save_s": wall / max(1, done[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer lookups and saves")
    ap.add_argument("--delay-ms", type=float, default=200.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "lookup_while_saving.json"))
    args = ap.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is needed (scripts/install_servers.sh)")
    torch.set_num_threads(1)
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="hc-lws-"))
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        time.sleep(0.5)
        proxy = DelayProxy(port, args.delay_ms / 1e3)
        url = f"redis://127.0.0.1:{proxy.port}/0"
        n_look, n_save = (200, 6) if args.quick else (1000, 20)
        for inline in (False, True):
            d = tmp / ("inline" if inline else "lanes")
            rows.append(run(inline, args.delay_ms / 1e3, n_look, n_save, url, d))
        proxy.close()
    finally:
        redis.terminate()
        redis.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"lookups of a 32K-token prompt; saves of 50 MB states to host+NVMe(fsync)+remote "
          f"({args.delay_ms:.0f} ms replies)")
    print(f"{'executor':<20}{'idle p50':>9}{'idle p99':>9}{'busy p50':>9}{'busy p99':>9}"
          f"{'busy max':>9}{'p99 x':>7}{'saves':>7}")
    for r in rows:
        print(f"{r['executor']:<20}{r['idle_p50_ms']:>9.3f}{r['idle_p99_ms']:>9.3f}"
              f"{r['busy_p50_ms']:>9.3f}{r['busy_p99_ms']:>9.3f}{r['busy_max_ms']:>9.1f}"
              f"{r['p99_ratio']:>7.2f}{r['saves']:>7}")
    print("p99_ratio: lookup p99 while saving / lookup p99 idle, same run (1.0 = saves cost lookups nothing)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
