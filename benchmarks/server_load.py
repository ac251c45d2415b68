"""Load on our cache server from many client processes, then the same plain load against a
real ``lmcache_server`` (lmcache 0.5.6), interleaved, as ratios.

Phase 1 (``mixed``, ``--seconds``): ``--clients`` processes (``benchmarks/load_worker.py``)
against our server (a real ``hybrid-connector server`` subprocess): all but
``--lookup-clients`` do LMCache ``lm://`` PUT/GET/EXIST of 0.6 MiB anchors, 8 MiB KV chunks
and 50 MiB states (fewer of the large ones), the others hybrid LOOKUPs (and a verified LOAD
every 4th) through ``ServerCache`` of conversations saved before the run. Every read is
verified (self-checking payloads, the version last put); the server's STATS is sampled
every 0.5 s and every tier's use checked against its capacity.

Phase 2 (``compare``): every client does the plain load, in rounds that alternate between
our server and ``lmcache_server`` (ABBA...), same seeds; ours/lmcache ratios of ops/s and
MB/s, overall and per op. ``lmcache_server`` keeps everything in RAM without a budget: our
server gets a host tier larger than the working set (nothing is evicted), said in the
results' ``fairness`` notes with what each side does per object.

    python benchmarks/server_load.py [--quick] [--seconds 60] [--clients 16]

Results: ``benchmarks/results/server_load[_quick].json``.
"""

# ruff: noqa: E402  (imports follow the sys.path fix below)
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, ROOT)

import argparse
import importlib.util
import json
import re
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

_spec = importlib.util.spec_from_file_location("load_worker", os.path.join(_HERE, "load_worker.py"))
assert _spec is not None and _spec.loader is not None
load_worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(load_worker)

MiB = 1 << 20
SIZES = {"anchor": 614_400, "kv": 8 * MiB, "state": 50 * MiB}  # 0.6 MiB, 8 MiB, 50 MiB
SLOTS = {"anchor": 8, "kv": 4, "state": 1}  # per client: the working set it overwrites
SIZE_WEIGHTS = {"anchor": 0.6, "kv": 0.35, "state": 0.05}  # by count
OP_WEIGHTS = {"put": 0.35, "get": 0.45, "exist": 0.2}
PRESET, CACHE = "qwen3.5-0.8b", {"chunk_size": 256}
FAIRNESS = [
    "ours: asyncio+uvloop server; a PUT's body is read by the transport straight into one "
    "buffer that leaves room for a small header (key string, LMCache metadata), placed by "
    "the tier ledger (per-kind byte budget, LRU) and copied once into the host tier's memory, "
    "stored while the connection's next frame is read; a GET copies it out of the tier and "
    "checks the header's key. Host tier sized above the working set: nothing is evicted, "
    "as in lmcache_server, which has no budget at all.",
    "lmcache_server 0.5.6: one thread per connection, recv into a growing bytearray, the "
    "bytes kept in a dict (no budget, no accounting, no copy into a managed pool), GET "
    "sends the stored bytes as they are.",
    "clients: one process each, one connection, blocking sockets; PUT is timed to the end "
    "of its send (LMCache's PUT has no reply); every GET is verified by the client (xxh3-128 "
    "over the payload) on both sides. Same seeds, sizes and op mix on both servers; rounds "
    "alternate ABBA so drift in the machine's load hits both.",
    "2 CPU cores are shared by the server, all clients and other jobs: client processes "
    "(verification, payload windows, socket copies) compete with the server for them, so "
    "the figures are a floor of what either server does on its own cores.",
]

WHY_BELOW = [  # what profiling showed (in-process runs of the server's paths, this VM)
    "CPU per byte decides on 2 shared cores (compare.ratio.server_cpu_per_MB). Ours copies a "
    "PUT byte twice in user space (socket -> frame buffer by the transport, frame buffer -> "
    "the host tier's slab) like lmcache_server (recv -> bytes -> bytearray), but also places "
    "it in the ledger and runs it through the tier's op lane (a thread hop); a GET copies "
    "once more than lmcache_server (slab -> a buffer the caller owns) before the socket.",
    "one event-loop thread writes every connection's replies; lmcache_server has a thread "
    "per connection in blocking sendall with the GIL released.",
    "fixed earlier (each measured here): StreamReader copies (0.9-1.05 ms/MB), page faults "
    "on fresh buffers (GET 0.53 -> 0.22 ms/MB with freed memory kept mapped) and on a fresh "
    "host slab (first put 0.93 -> 0.21 ms/MB once faulted in).",
]

# ---------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ours_config(workdir: Path, host_kv_mb: int, state_mb: int = 512,
                anchor_mb: int = 128, **extra: Any) -> dict[str, Any]:
    total = host_kv_mb + state_mb + anchor_mb
    cfg: dict[str, Any] = {
        "local_cpu": True, "max_local_cpu_size": f"{total}MiB",
        "pools": {"host": {"kv": f"{host_kv_mb}MiB", "state": f"{state_mb}MiB",
                           "anchor": f"{anchor_mb}MiB"}},
        "server": {"port": 0, "workers": 8, "max_object_bytes": 64 * MiB},
    }
    return {**cfg, **extra}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class OurServer:
    """``hybrid-connector server`` in a subprocess; ``url`` once listening."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        path = workdir / "server.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": ROOT}
        env.pop("HYBRID_CONNECTOR_CONFIG", None)
        self.log = (workdir / "server.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybrid_connector.cli", "server", "--config", str(path)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=ROOT)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if (m := re.search(r"listening on (hc://(\S+):(\d+))", line)) is not None:
                self.url, self.host, self.port = m.group(1), m.group(2), int(m.group(3))
                return
        raise RuntimeError(f"our server did not start (see {workdir / 'server.log'})")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


class LmcacheServer:
    def __init__(self, workdir: Path) -> None:
        binary = Path(sys.executable).parent / "lmcache_server"
        if not binary.exists():
            raise FileNotFoundError(f"{binary} (run scripts/install_servers.sh)")
        self.host, self.port = "127.0.0.1", free_port()
        self.log = (workdir / "lmcache.log").open("wb")
        self.proc = subprocess.Popen([str(binary), self.host, str(self.port), "cpu"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lmcache_server exited ({workdir / 'lmcache.log'})")
            try:
                socket.create_connection((self.host, self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("lmcache_server did not listen")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# ---------------------------------------------------------------- clients
class Clients:
    """``n`` worker processes, each reading one JSON command per line."""

    def __init__(self, n: int) -> None:
        env = {**os.environ, "PYTHONPATH": ROOT}
        self.procs = [subprocess.Popen([sys.executable, os.path.join(_HERE, "load_worker.py")],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env=env, cwd=ROOT) for _ in range(n)]
        for p in self.procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"

    def send(self, cmds: list[dict[str, Any] | None]) -> None:
        for p, c in zip(self.procs, cmds, strict=True):
            if c is not None:
                assert p.stdin is not None
                p.stdin.write(json.dumps(c) + "\n")
                p.stdin.flush()

    def collect(self, cmds: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
        out = []
        for p, c in zip(self.procs, cmds, strict=True):
            if c is not None:
                assert p.stdout is not None
                out.append(json.loads(p.stdout.readline()))
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None and p.stdin is not None:
                p.stdin.write('{"op": "quit"}\n')
                p.stdin.close()
        for p in self.procs:
            p.wait(60)


class Budgets:
    """Samples our server's STATS every ``every`` s: every tier's use against capacity."""

    def __init__(self, url: str, every: float = 0.5, token: str | None = None) -> None:
        self.url, self.every, self.token = url, every, token
        self.samples = self.violations = self.failures = 0
        self.max_use: dict[str, dict[str, float]] = {}
        self.examples: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from hybrid_connector.remote.client import admin

        while not self._stop.wait(self.every):
            try:
                tiers = admin.stats(self.url, self.token, timeout_s=30)["tiers"]
            except Exception:
                self.failures += 1
                continue
            self.samples += 1
            for name, t in tiers.items():
                for kind, cap in t["capacity"].items():
                    used = t["used"].get(kind, 0)
                    if cap:
                        cell = self.max_use.setdefault(name, {})
                        cell[kind] = max(cell.get(kind, 0.0), round(used / cap, 4))
                    if used > cap:
                        self.violations += 1
                        self.examples.append(f"{name}/{kind}: {used} > {cap}")

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(60)
        return {"samples": self.samples, "violations": self.violations,
                "stats_failures": self.failures, "max_use": self.max_use,
                "examples": self.examples[:5]}


# ---------------------------------------------------------------- one phase
def plain_cmd(i: int, host: str, port: int, seconds: float, seed: int,
              sizes: dict[str, int], slots: dict[str, int],
              token: str | None = None) -> dict[str, Any]:
    return {"op": "plain", "client": i, "host": host, "port": port, "seconds": seconds,
            "seed": seed, "sizes": sizes, "slots": slots, "size_weights": SIZE_WEIGHTS,
            "op_weights": OP_WEIGHTS, "token": token}


def run_phase(clients: Clients, cmds: list[dict[str, Any] | None], seconds: float,
              bar: tqdm | None = None) -> tuple[list[dict[str, Any]], float]:
    """Send, wait ``seconds`` (the bar advancing), collect; (results, wall seconds)."""
    t0 = time.perf_counter()
    clients.send(cmds)
    while (left := t0 + seconds - time.perf_counter()) > 0:
        time.sleep(min(0.5, left))
        if bar is not None:
            bar.update(min(0.5, max(left, 0.0)))
    results = clients.collect(cmds)
    return results, time.perf_counter() - t0


def summarize(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Per op (and op:size class): ops, MB, ops/s, MB/s, p50/p99 ms; totals; errors."""
    lat: dict[str, list[float]] = {}
    ops: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for r in results:
        for k, v in r["lat"].items():
            lat.setdefault(k, []).extend(v)
            lat.setdefault(k.split(":")[0], []).extend(v) if ":" in k else None
        for k, v in r["ops"].items():
            for name in {k, k.split(":")[0]}:
                ops[name] = ops.get(name, 0) + v
                nbytes[name] = nbytes.get(name, 0) + r["bytes"][k]
    seconds = max([r.get("seconds", 0.0) for r in results] + [1e-9])
    per_op = {k: {"ops": ops[k], "MB": round(nbytes[k] / 1e6, 1),
                  "ops_per_s": round(ops[k] / seconds, 1),
                  "MB_per_s": round(nbytes[k] / 1e6 / seconds, 1),
                  "p50_ms": round(float(np.percentile(lat[k], 50)) * 1e3, 2),
                  "p99_ms": round(float(np.percentile(lat[k], 99)) * 1e3, 2)}
              for k in sorted(ops) if lat.get(k)}
    top = [k for k in per_op if ":" not in k]
    misses: dict[str, int] = {}
    for r in results:
        for k, v in r["misses"].items():
            misses[k] = misses.get(k, 0) + v
    return {
        "seconds": round(seconds, 2), "wall_s": round(wall, 2), "clients": len(results),
        "ops_per_s": round(sum(ops[k] for k in top) / seconds, 1),
        "MB_per_s": round(sum(nbytes[k] for k in top) / 1e6 / seconds, 1),
        "per_op": per_op, "errors": sum(r["errors"] for r in results),
        "corrupt": sum(r["corrupt"] for r in results), "misses": misses,
        "short_hits": sum(r.get("short_hits", 0) for r in results),
        "hit_tokens": sum(r.get("hit_tokens", 0) for r in results),  # lookups: found
        "expected_tokens": sum(r.get("expected_tokens", 0) for r in results),  # populated
        "error_samples": [e for r in results for e in r["error_samples"]][:10],
    }


def populate(url: str, n: int, length: int, token: str | None = None) -> list[dict[str, Any]]:
    """Save ``n`` conversations through ``ServerCache``; what a lookup of each finds."""
    import torch

    from hybrid_connector.core.config import load_config
    from hybrid_connector.core.keys import ObjectKind
    from hybrid_connector.geometry.presets import get_preset
    from hybrid_connector.remote.client.server_cache import ServerCache
    from hybrid_connector.runtime.session import RequestSession

    conv_bytes = load_worker.conv_bytes

    server = {"url": url, **({"token": token} if token else {})}
    cfg = load_config(overrides={"cache_server": server, **CACHE}, environ={})
    cache = ServerCache(cfg, get_preset(PRESET))
    convs = []
    for c in range(n):
        seed = 1000 + c
        prompt = load_worker.conv_prompt(seed, length)
        s = RequestSession(cache, prompt)
        s.load()
        s.release()

        def obj(kind: ObjectKind, a: int, b: int, seed: int = seed) -> torch.Tensor:
            n = cache.expected_nbytes(kind, a, b)
            return torch.frombuffer(bytearray(conv_bytes(seed, kind.value, a, b, n)),
                                    dtype=torch.uint8)

        def kv(a: int, b: int, obj: Any = obj) -> torch.Tensor:
            return obj(ObjectKind.KV, a, b)

        s.save_prefill(kv, {q: obj(ObjectKind.STATE, q, q) for q in s.checkpoints})
        q = cache.final_checkpoint(len(s.tokens))
        s.finish(kv, {q: obj(ObjectKind.STATE, q, q)} if q else {})
        convs.append({"seed": seed, "len": length})
    cache.flush()
    for c in convs:
        c["expect"] = cache.lookup(load_worker.conv_prompt(c["seed"], c["len"], 64)).num_tokens
    cache.close()
    return convs


# ---------------------------------------------------------------- the run
def mixed(clients: Clients, ours: Any, seconds: float, lookup_clients: int,
          convs: list[dict[str, Any]], sizes: dict[str, int], slots: dict[str, int],
          bar: tqdm | None = None, seed: int = 0, token: str | None = None) -> dict[str, Any]:
    """Phase 1 against ``ours`` (``.url``, ``.host``, ``.port``); ``token``: the server's."""
    n = len(clients.procs)
    plain_n = n - lookup_clients

    def lookup(i: int, secs: float) -> dict[str, Any]:
        return {"op": "lookup", "url": ours.url, "seconds": secs, "seed": seed + i,
                "conversations": convs, "cache": CACHE, "preset": PRESET, "load_every": 4,
                "token": token}

    warm: list[dict[str, Any] | None] = [None] * plain_n + [lookup(i, 0) for i in
                                                            range(plain_n, n)]
    clients.send(warm)  # imports and HELLO before the clock
    clients.collect(warm)
    budgets = Budgets(ours.url, token=token)
    cmds: list[dict[str, Any] | None] = [
        plain_cmd(i, ours.host, ours.port, seconds, seed + i, sizes, slots, token)
        if i < plain_n
        else lookup(i, seconds) for i in range(n)]
    proc = getattr(ours, "proc", None)
    c0 = cpu_seconds(proc.pid if proc is not None else os.getpid())
    results, wall = run_phase(clients, cmds, seconds, bar)
    out = summarize(results, wall)
    out["server_cpu_s"] = round(cpu_seconds(proc.pid if proc is not None else os.getpid())
                                - c0, 2)  # in-process (tests): this whole process
    out["lookup_clients"] = lookup_clients
    out["budgets"] = budgets.stop()
    return out


def compare(clients: Clients, ours: Any, lmc: Any, rounds: int, round_s: float,
            sizes: dict[str, int], slots: dict[str, int], bar: tqdm | None = None
            ) -> dict[str, Any]:
    """Phase 2: plain load, rounds alternating ours/lmcache (ABBA), same seeds per pair."""
    sides: dict[str, list[dict[str, Any]]] = {"ours": [], "lmcache": []}
    walls = {"ours": 0.0, "lmcache": 0.0}
    cpu = {"ours": 0.0, "lmcache": 0.0}
    order = []
    for r in range(rounds):
        pair = ["ours", "lmcache"] if r % 2 == 0 else ["lmcache", "ours"]
        for side in pair:
            srv = ours if side == "ours" else lmc
            cmds: list[dict[str, Any] | None] = [
                plain_cmd(i, srv.host, srv.port, round_s, 100 + 31 * r + i, sizes, slots)
                for i in range(len(clients.procs))]
            c0 = cpu_seconds(srv.proc.pid)
            results, wall = run_phase(clients, cmds, round_s, bar)
            cpu[side] += cpu_seconds(srv.proc.pid) - c0
            for res in results:  # per-round seconds add up across rounds
                res["round"] = r
            sides[side].append({"results": results, "wall": wall})
            walls[side] += wall
            order.append(side)
    out: dict[str, Any] = {"rounds": rounds, "round_s": round_s, "order": order}
    for side, runs in sides.items():
        merged = merge_rounds(runs)
        moved = sum(v["MB"] for k, v in merged["per_op"].items() if ":" not in k)
        merged["server_cpu_s"] = round(cpu[side], 2)
        merged["server_cpu_ms_per_MB"] = round(1e3 * cpu[side] / max(moved, 1e-9), 3)
        out[side] = merged
    o, lm = out["ours"], out["lmcache"]
    out["ratio"] = {
        "ops_per_s": round(o["ops_per_s"] / max(lm["ops_per_s"], 1e-9), 3),
        "MB_per_s": round(o["MB_per_s"] / max(lm["MB_per_s"], 1e-9), 3),
        "per_op_ops_per_s": {k: round(v["ops_per_s"] / max(lm["per_op"][k]["ops_per_s"], 1e-9), 3)
                             for k, v in o["per_op"].items() if k in lm["per_op"]},
        "server_cpu_per_MB": round(o["server_cpu_ms_per_MB"]
                                   / max(lm["server_cpu_ms_per_MB"], 1e-9), 3),
        "per_op_p50": {k: round(v["p50_ms"] / max(lm["per_op"][k]["p50_ms"], 1e-9), 3)
                       for k, v in o["per_op"].items() if k in lm["per_op"]},
    }
    return out


def merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary over rounds: each client's results concatenated, seconds summed."""
    by_client: dict[int, dict[str, Any]] = {}
    for run in runs:
        for i, r in enumerate(run["results"]):
            acc = by_client.setdefault(i, {"ops": {}, "bytes": {}, "lat": {}, "errors": 0,
                                           "corrupt": 0, "misses": {}, "error_samples": [],
                                           "seconds": 0.0})
            for k, v in r["ops"].items():
                acc["ops"][k] = acc["ops"].get(k, 0) + v
                acc["bytes"][k] = acc["bytes"].get(k, 0) + r["bytes"][k]
            for k, v in r["lat"].items():
                acc["lat"].setdefault(k, []).extend(v)
            for k, v in r["misses"].items():
                acc["misses"][k] = acc["misses"].get(k, 0) + v
            acc["errors"] += r["errors"]
            acc["corrupt"] += r["corrupt"]
            acc["error_samples"] += r["error_samples"]
            acc["seconds"] += r["seconds"]
    return summarize(list(by_client.values()), sum(r["wall"] for r in runs))


def table(title: str, s: dict[str, Any]) -> str:
    cpu = (f", server CPU {s['server_cpu_s']} s ({s['server_cpu_ms_per_MB']} ms/MB)"
           if "server_cpu_ms_per_MB" in s else "")
    lines = [f"{title}: {s['clients']} clients, {s['seconds']} s: {s['ops_per_s']} ops/s, "
             f"{s['MB_per_s']} MB/s, errors {s['errors']}, corrupt {s['corrupt']}, "
             f"misses {s['misses']}{cpu}",
             f"  {'op':<14}{'ops':>8}{'ops/s':>9}{'MB/s':>9}{'p50 ms':>9}{'p99 ms':>9}"]
    for k, v in s["per_op"].items():
        lines.append(f"  {k:<14}{v['ops']:>8}{v['ops_per_s']:>9}{v['MB_per_s']:>9}"
                     f"{v['p50_ms']:>9}{v['p99_ms']:>9}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10 s mixed, 2 short compare rounds")
    ap.add_argument("--seconds", type=float, default=None, help="mixed phase (default 60)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--lookup-clients", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="compare rounds (default 6)")
    ap.add_argument("--round-s", type=float, default=None, help="seconds per side per round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    seconds = args.seconds or (10.0 if args.quick else 60.0)
    rounds = args.rounds or (2 if args.quick else 6)
    round_s = args.round_s or (3.0 if args.quick else 5.0)
    ws = args.clients * sum(SIZES[c] * SLOTS[c] for c in SIZES)
    host_kv_mb = int(2 * ws / MiB) + 256  # above the working set (and the conversations)
    out: dict[str, Any] = {"quick": args.quick, "cpus": os.cpu_count(),
                           "loadavg_start": os.getloadavg(), "sizes": SIZES, "slots": SLOTS,
                           "size_weights": SIZE_WEIGHTS, "op_weights": OP_WEIGHTS,
                           "working_set_MB": round(ws / 1e6, 1), "host_kv_MiB": host_kv_mb,
                           "fairness": FAIRNESS}
    with tempfile.TemporaryDirectory(prefix="server_load-") as tmp:
        workdir = Path(tmp)
        ours = OurServer(ours_config(workdir, host_kv_mb), workdir)
        lmc: LmcacheServer | None = None
        try:
            lmc = LmcacheServer(workdir)
        except (OSError, RuntimeError) as exc:
            out["lmcache_unavailable"] = f"{type(exc).__name__}: {exc}"
        clients = Clients(args.clients)
        try:
            convs = populate(ours.url, 4, 2000) if args.lookup_clients else []
            out["conversations"] = convs
            total = seconds + (2 * rounds * round_s if lmc else 0)
            with tqdm(total=round(total, 1), unit="s", desc="server load") as bar:
                out["mixed"] = mixed(clients, ours, seconds, args.lookup_clients, convs,
                                     SIZES, SLOTS, bar)
                if lmc is not None:
                    out["compare"] = compare(clients, ours, lmc, rounds, round_s, SIZES,
                                             SLOTS, bar)
        finally:
            clients.close()
            ours.stop()
            if lmc is not None:
                lmc.stop()
    out["loadavg_end"] = os.getloadavg()
    print(table("mixed (ours, with lookups)", out["mixed"]))
    print("budgets:", json.dumps(out["mixed"]["budgets"]))
    if "compare" in out:
        c = out["compare"]
        print(table("compare: ours", c["ours"]))
        print(table("compare: lmcache_server", c["lmcache"]))
        print("ratio ours/lmcache:", json.dumps(c["ratio"]))
        if c["ratio"]["MB_per_s"] < 1.0:
            out["why_below_target"] = WHY_BELOW
            print("why ours moves fewer MB/s than lmcache_server here:\n- " + "\n- ".join(WHY_BELOW))
    else:
        print("lmcache_server unavailable:", out.get("lmcache_unavailable"))
    path = args.json or os.path.join(_HERE, "results",
                                     f"server_load{'_quick' if args.quick else ''}.json")
    Path(path).write_text(json.dumps(out, indent=2))
    print("wrote", path)


if __name__ == "__main__":
    main()
