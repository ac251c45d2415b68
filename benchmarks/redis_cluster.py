"""Shared-tier throughput: a 3-shard Redis Cluster (3 masters, each with a replica unless
``--replicas 0``) against one ``redis-server``, both started on 127.0.0.1 in the same run.

16 concurrent clients (one forked process each, so Python's GIL is not what is measured),
each with its own remote-tier client (``RedisClusterClient`` / ``RedisClient``, the code the
tier runs: one deadline per call, chunked values on the cluster), put then get distinct
objects of realistic sizes (a 0.6 MB KV chunk, an 8 MB state, a 50 MB state) for a fixed
time per phase. The sides are interleaved (the order alternates each rep), every read is
checked against what was written, and the store is flushed between phases. Prints ops/s,
MB/s and the cluster/single ratio per size and op; writes
``benchmarks/results/redis_cluster[_quick][_r<replicas>].json``.

    python benchmarks/redis_cluster.py [--quick] [--clients 16] [--replicas 1]

What to expect: Redis executes commands on one thread per server, so one ``redis-server``
saturates one core; three masters can use three. The ratio shows sharding's gain only
where the host has cores to spare for every server *and* the 16 clients: on a 2-core host
the clients' own CPU (copying megabytes through sockets) and the servers share two cores,
so the cluster cannot run faster than one server there; the printed ``cpus`` and load say
which regime a run was in.
"""

# ruff: noqa: E402  (imports follow the sys.path fix below)
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "tests", "tiers"))

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from typing import Any

MB = 10**6
SIZES = {"kv_0.6MB": 600_000, "state_8MB": 8 * MB, "state_50MB": 50 * MB}


CHUNK = [4 << 20]  # set from --chunk-size before the workers fork


def _client(url: str) -> Any:
    from hybrid_connector.tiers.remote.tier import make_client

    return make_client(url, timeout=30.0, chunk_size=CHUNK[0])


def worker(url: str, wid: int, size: int, seconds: float, start: Any, out: Any) -> None:
    """Put distinct objects for ``seconds``, then read them back (cycling) for as long."""
    client = _client(url)
    blob = bytes((wid * 7 + i) % 251 for i in range(4096)) * (size // 4096 + 1)
    blob = blob[:size]
    client.health()  # connect (and discover the cluster) before the clock starts
    start.wait()
    names: list[str] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or not names:
        n = f"bench:{{{wid}-{len(names)}}}"
        client.put(n, blob)
        names.append(n)
    t_put = time.perf_counter() - t0
    start.wait()
    gets, bad = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or gets == 0:
        got = client.get(names[gets % len(names)], size + 1)
        bad += got is None or len(got) != size or got[:64] != blob[:64] or got[-64:] != blob[-64:]
        gets += 1
    t_get = time.perf_counter() - t0
    client.close()
    out.put((wid, len(names), t_put, gets, t_get, bad))


def run_phase(url: str, size: int, clients: int, seconds: float) -> dict[str, float]:
    ctx = mp.get_context("fork")  # the client modules are imported already: cheap starts
    start, out = ctx.Barrier(clients + 1), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, w, size, seconds, start, out)) for w in range(clients)]
    for p in procs:
        p.start()
    start.wait()  # puts begin
    start.wait()  # gets begin
    res = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    bad = sum(r[5] for r in res)
    if bad:
        raise RuntimeError(f"{bad} reads did not return what was written")
    # aggregate rate: every client's ops over the phase's wall time (the slowest client)
    puts, gets = sum(r[1] for r in res), sum(r[3] for r in res)
    t_put, t_get = max(r[2] for r in res), max(r[4] for r in res)
    return {"put_ops_s": puts / t_put, "put_MB_s": puts * size / MB / t_put,
            "get_ops_s": gets / t_get, "get_MB_s": gets * size / MB / t_get}


def flush(url: str) -> None:
    import redis
    from redis.cluster import ClusterNode, RedisCluster

    if "+cluster" in url:
        host, port = url.split("://")[1].split(",")[0].rsplit(":", 1)
        rc = RedisCluster(startup_nodes=[ClusterNode(host, int(port))])
        rc.flushall(target_nodes=RedisCluster.PRIMARIES)
        rc.close()
    else:
        redis.Redis.from_url(url).flushall()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="0.6 MB and 8 MB, 1 rep, 1.5 s phases")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=None, help="per put or get phase")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--sizes", default=None, help=f"comma list of {', '.join(SIZES)}")
    ap.add_argument("--chunk-size", type=int, default=4 << 20, help="the cluster's chunk size")
    ap.add_argument("--node-timeout-ms", type=int, default=5000,
                    help="cluster-node-timeout: long enough that a starved host is no failover")
    args = ap.parse_args()
    CHUNK[0] = args.chunk_size
    seconds = args.seconds or (1.5 if args.quick else 3.0)
    reps = args.reps or (1 if args.quick else 2)
    sizes = {k: v for k, v in SIZES.items() if not (args.quick and v > 10 * MB)}
    if args.sizes:
        sizes = {k: SIZES[k] for k in args.sizes.split(",")}

    import torch
    from cluster_servers import run_cluster
    from tier_servers import run_redis

    import hybrid_connector.tiers.remote.tier  # noqa: F401  (imported once, before the workers fork)

    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp, run_redis(Path(tmp)) as single, \
            run_cluster(Path(tmp) / "cluster", replicas=args.replicas,
                        node_timeout_ms=args.node_timeout_ms) as cluster:
        urls = {"single": single, "cluster": cluster.url}
        rows: dict[str, dict[str, list[dict[str, float]]]] = {}
        for name, size in sizes.items():
            n_clients = args.clients
            rows[name] = {"single": [], "cluster": []}
            for rep in range(reps):
                for side in (("single", "cluster") if rep % 2 == 0 else ("cluster", "single")):
                    r = run_phase(urls[side], size, n_clients, seconds)
                    flush(urls[side])
                    rows[name][side].append(r)
                    print(f"{name:11s} rep {rep} {side:7s} put {r['put_ops_s']:8.1f} ops/s "
                          f"{r['put_MB_s']:7.0f} MB/s   get {r['get_ops_s']:8.1f} ops/s "
                          f"{r['get_MB_s']:7.0f} MB/s", flush=True)
    best = {n: {s: {m: max(r[m] for r in rs) for m in rs[0]} for s, rs in sides.items()}
            for n, sides in rows.items()}
    print(f"\nbest of {reps}, {args.clients} clients, cpus {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.2f}: ratio cluster/single")
    summary = {}
    for n, b in best.items():
        ratio = {op: b["cluster"][f"{op}_ops_s"] / b["single"][f"{op}_ops_s"] for op in ("put", "get")}
        summary[n] = {"single": b["single"], "cluster": b["cluster"], "ratio_cluster_over_single": ratio}
        print(f"{n:11s} put {b['single']['put_ops_s']:8.1f} -> {b['cluster']['put_ops_s']:8.1f} ops/s "
              f"(x{ratio['put']:.2f})   get {b['single']['get_ops_s']:8.1f} -> "
              f"{b['cluster']['get_ops_s']:8.1f} ops/s (x{ratio['get']:.2f})")
    suffix = ("_quick" if args.quick else "") + ("" if args.replicas == 1 else f"_r{args.replicas}")
    if args.sizes or args.chunk_size != 4 << 20:
        suffix += "_custom"
    out = Path(_HERE) / "results" / f"redis_cluster{suffix}.json"
    out.write_text(json.dumps({
        "clients": args.clients, "cpus": os.cpu_count(), "replicas": args.replicas,
        "cluster_chunk_size": args.chunk_size,
        "seconds_per_phase": seconds, "reps": reps, "sizes": sizes,
        "load_avg_after": os.getloadavg()[0], "summary": summary, "runs": rows,
        "note": "one process per client; cluster values over 4 MiB chunked (the 8 MB and 50 MB "
                "objects are 2 and 12 commands); best of reps; see the module docstring"},
        indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
