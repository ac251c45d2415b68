"""Our cache server under attack (issue 25, "Must show"): honest clients keep
``benchmarks/server_load.py``'s mixed workload going while hostile clients run items 1-7 of
the hardening issue at once (``benchmarks/soak_attacks.py``), against the same load alone.

One real ``hybrid-connector server`` with a token (every honest client AUTHs), an admin
token and the hardening bounds set (see ``soak_config``). Phase A: the honest mixed load
alone for ``--seconds`` (plain LMCache PUT/GET/EXIST with verified reads, hybrid
LOOKUP/LOAD of conversations saved before). Phase B: the same load, same seeds, while the
attackers run. Reported per phase: honest ops/s, p50/p99 per op, errors, corrupt reads,
misses, lookup hit tokens against what was found before the run, the server's STATS
(connection layer, models, plain names, leases) and its RSS sampled every 0.2 s from
``/proc`` (and its kernel-kept peak, ``VmHWM``, reset per phase) against the budget:
host pools + ``max_inflight_bytes`` + the unauthenticated budget
(``max_unauthenticated * max_auth_frame_bytes``) + the idle server's own memory (its RSS
once started and its pools faulted in, less the pools) + the server's
``malloc_slack_bytes`` (freed memory it keeps for reuse, returned past that) +
``--slack-mb``. Pass: every
op's p99(B) <= 3x p99(A), peak RSS <= budget, 0 honest errors and 0 corrupt reads, no
lookup hit lost, no forged LOAD served.

    python benchmarks/server_soak.py [--quick] [--seconds 40] [--clients 6]

Results: ``benchmarks/results/server_soak[_quick].json``.
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
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

_spec = importlib.util.spec_from_file_location("server_load", os.path.join(_HERE, "server_load.py"))
assert _spec is not None and _spec.loader is not None
load = importlib.util.module_from_spec(_spec)
sys.modules["server_load"] = load
_spec.loader.exec_module(load)

MiB, KiB = 1 << 20, 1 << 10
TOKEN, ADMIN = "soak-token-0123456", "soak-admin-7654321"
QUICK_SIZES = {"anchor": 16 * KiB, "kv": 256 * KiB, "state": 1 * MiB}
QUICK_SLOTS = {"anchor": 8, "kv": 6, "state": 3}
P99_LIMIT = 3.0


def soak_config(workdir: Path, plain_n: int, quick: bool) -> dict[str, Any]:
    """The server: host pools above the honest working set (twice it, plus room for the
    conversations and the slow readers' object), the token and every hardening bound."""
    sizes, slots = (QUICK_SIZES, QUICK_SLOTS) if quick else (load.SIZES, load.SLOTS)
    ws = plain_n * sum(sizes[c] * slots[c] for c in sizes)
    kv_mb = int(2 * ws / MiB) + (96 if quick else 256)
    cfg = load.ours_config(workdir, kv_mb, state_mb=128 if quick else 512,
                           anchor_mb=16 if quick else 128)
    cfg["server"] |= {
        "token": TOKEN, "admin_token": ADMIN, "http_port": None,
        # a GET waits for room for max_object_bytes: a quarter of the budget (or less)
        # (above a conversation's 18.6 MiB state and the plain load's 50 MiB ones)
        "max_inflight_bytes": f"{128 if quick else 256}MiB", "max_frame_bytes": "64MiB",
        "max_object_bytes": f"{32 if quick else 64}MiB", "idle_timeout_s": 60.0,
        "max_auth_frame_bytes": "64KiB", "auth_timeout_s": 3.0, "max_unauthenticated": 32,
        "max_connections": 512, "max_connections_per_peer": 128,
        "max_models": 16, "lease_timeout_s": 30.0, "max_leases_per_session": 64,
        "max_pinned_fraction": 0.5,
    }
    return cfg


def malloc_slack(server: dict[str, Any]) -> int:
    """The freed memory the server keeps before trimming: its config's, else the default."""
    from hybrid_connector.core.config_server import ServerSettings

    v = server.get("malloc_slack_bytes", ServerSettings().malloc_slack_bytes)
    return size_of(v) if isinstance(v, str) else int(v or 0)


def size_of(text: str) -> int:
    from hybrid_connector.core.sizes import parse_size

    return int(parse_size(text))


# ---------------------------------------------------------------- the server's memory
def status(pid: int, field: str) -> int:
    """``/proc/<pid>/status`` ``field`` (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * KiB
    raise KeyError(field)


def mappings(pid: int, top: int = 6) -> list[dict[str, Any]]:
    """The ``top`` mappings of ``pid`` by resident size (``/proc/<pid>/smaps``): where the
    memory is (the host slab, the heap, large anonymous allocations, libraries)."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            cur = {"name": head[5] if len(head) > 5 else "[anon]",
                   "size_MiB": round((hi - lo) / MiB, 1), "rss_MiB": 0.0}
            out.append(cur)
        elif head[0] == "Rss:":
            cur["rss_MiB"] = round(int(head[1]) * KiB / MiB, 1)
    return sorted(out, key=lambda m: -m["rss_MiB"])[:top]


def rss_by_kind(pid: int, pool: int) -> dict[str, Any]:
    """Resident MiB by kind of mapping: the host slab (its own mapping), ``[heap]``, glibc
    thread arenas (anonymous mappings of up to 64 MiB, ``HEAP_MAX_SIZE``, over 8 MiB
    resident), other anonymous memory, files (libraries)."""
    out = {"slab": 0.0, "heap": 0.0, "arenas": 0.0, "arena_count": 0, "anon_other": 0.0,
           "files": 0.0}
    for m in mappings(pid, 100_000):
        if 0 <= m["size_MiB"] * MiB - pool <= 8 * MiB:
            out["slab"] += m["rss_MiB"]
        elif m["name"] == "[heap]":
            out["heap"] += m["rss_MiB"]
        elif m["name"] == "[anon]" and m["rss_MiB"] > 8 and m["size_MiB"] <= 64:
            out["arenas"] += m["rss_MiB"]
            out["arena_count"] += 1
        elif m["name"].startswith("["):
            out["anon_other"] += m["rss_MiB"]
        else:
            out["files"] += m["rss_MiB"]
    return {k: round(v, 1) for k, v in out.items()}


def pool_resident(pid: int, pool: int) -> int:
    """Resident bytes of the host slab (``pool`` bytes): its own mapping's, or, where the
    allocator placed it in ``[heap]`` (the server raises glibc's mmap threshold), the
    heap's resident bytes up to ``pool``."""
    maps = mappings(pid, 10_000)
    own = [m for m in maps if 0 <= m["size_MiB"] * MiB - pool <= 8 * MiB]
    if own:
        return int(max(m["rss_MiB"] for m in own) * MiB)
    heap = [m for m in maps if m["name"] == "[heap]" and m["size_MiB"] * MiB >= pool]
    return int(min(pool, heap[0]["rss_MiB"] * MiB)) if heap else 0


def settled_rss(pid: int, within: float = 60.0) -> int:
    """RSS once it stops growing (the pools' prefault done): < 2 MiB over 1 s."""
    last, deadline = status(pid, "VmRSS"), time.monotonic() + within
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = status(pid, "VmRSS")
        if abs(now - last) < 2 * MiB:
            return now
        last = now
    return last


class Rss:
    """Samples the server's VmRSS every ``every`` s; ``phase(name)`` starts a new peak
    (and resets the kernel's ``VmHWM`` through ``clear_refs`` where allowed)."""

    def __init__(self, pid: int, pool: int, every: float = 0.2) -> None:
        self.pid, self.pool, self.every = pid, pool, every
        self.peaks: dict[str, dict[str, Any]] = {}
        self.current = "idle"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def phase(self, name: str) -> None:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            hwm_reset = True
        except OSError:
            hwm_reset = False
        self.current = name
        self.peaks[name] = {"peak_MiB": 0.0, "samples": 0, "series_MiB": [],
                            "hwm_reset": hwm_reset, "t0": time.monotonic()}

    def end(self) -> dict[str, Any]:
        p = self.peaks[self.current]
        p["VmHWM_MiB"] = round(status(self.pid, "VmHWM") / MiB, 1)
        p["top_mappings"] = mappings(self.pid)
        p["by_kind_MiB"] = rss_by_kind(self.pid, self.pool)  # after the phase: 0 in flight
        self.current = "idle"
        p.pop("t0")
        return p

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            p = self.peaks.get(self.current)
            if p is None:
                continue
            try:
                rss = status(self.pid, "VmRSS") / MiB
            except (OSError, KeyError):
                return
            p["peak_MiB"] = round(max(p["peak_MiB"], rss), 1)
            p["samples"] += 1
            if p["samples"] % 5 == 1:  # one a second in the results
                p["series_MiB"].append([round(time.monotonic() - p["t0"], 1), round(rss, 1)])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


# ---------------------------------------------------------------- the attackers
class Attackers:
    """``soak_attacks.py`` in a subprocess: started, ``ready`` awaited, stopped, reported."""

    def __init__(self, cfg: dict[str, Any], timeout: float = 180.0) -> None:
        env = {**os.environ, "PYTHONPATH": ROOT}
        self.proc = subprocess.Popen([sys.executable, os.path.join(_HERE, "soak_attacks.py"),
                                      json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        line: list[str] = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()  # type: ignore[union-attr]
                                                        ), daemon=True)
        t.start()
        t.join(timeout)
        if not line or line[0].strip() != "ready":
            self.proc.kill()
            self.proc.wait(30)
            raise RuntimeError(f"attackers did not start: {line!r}")

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        self.proc.wait(60)
        return dict(out)


def server_figures(url: str) -> dict[str, Any]:
    """What the server's STATS says of the bounds under attack."""
    from hybrid_connector.remote.client import admin

    s = admin.stats(url, ADMIN, timeout_s=60.0)
    plain = s["plain"]
    held = sum(c[0] for by_tier in plain["held"].values() for by_kind in by_tier.values()
               for c in by_kind.values())
    srv = s["server"]
    return {"net": srv.get("net", {}), "leases": srv.get("leases"),
            "pinned_bytes": srv.get("pinned_bytes"), "sessions": srv.get("sessions"),
            "models": len(s["models"]), "plain_names": plain.get("names"),
            "plain_objects_held": held, "plain_puts": plain.get("puts"),
            "tiers_used_MiB": {t: {k: round(n / MiB, 1) for k, n in v["used"].items()}
                               for t, v in s["tiers"].items()}}


# ---------------------------------------------------------------- the run
def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.seconds or (8.0 if args.quick else 40.0)
    sizes, slots = (QUICK_SIZES, QUICK_SLOTS) if args.quick else (load.SIZES, load.SLOTS)
    plain_n = args.clients - args.lookup_clients
    out: dict[str, Any] = {"quick": args.quick, "seconds": seconds, "clients": args.clients,
                           "lookup_clients": args.lookup_clients, "cpus": os.cpu_count(),
                           "loadavg_start": os.getloadavg(), "sizes": sizes, "slots": slots}
    with tempfile.TemporaryDirectory(prefix="server_soak-") as tmp:
        workdir = Path(tmp)
        cfg = soak_config(workdir, plain_n, args.quick)
        out["server_config"] = cfg
        ours = load.OurServer(cfg, workdir)
        rss = clients = None
        try:
            s = cfg["server"]
            pool = size_of(cfg["max_local_cpu_size"])
            idle = settled_rss(ours.proc.pid)
            # the server faults its pools in at start: its own memory is the rest
            resident = pool_resident(ours.proc.pid, pool)
            own = idle - resident
            out["pool_resident_at_idle_MiB"] = round(resident / MiB, 1)
            budget = {"host_pools_MiB": pool / MiB,
                      "max_inflight_MiB": size_of(s["max_inflight_bytes"]) / MiB,
                      "unauthenticated_MiB": s["max_unauthenticated"]
                      * size_of(s["max_auth_frame_bytes"]) / MiB,
                      "idle_overhead_MiB": round(own / MiB, 1),
                      "malloc_slack_MiB": malloc_slack(s) / MiB, "slack_MiB": args.slack_mb}
            budget["total_MiB"] = round(sum(budget.values()), 1)
            out["idle_rss_MiB"], out["budget"] = round(idle / MiB, 1), budget
            # the admin token: populate's FLUSH (an admin command) then passes
            convs = load.populate(ours.url, 4, 2000, ADMIN) if args.lookup_clients else []
            out["conversations"] = convs
            clients = load.Clients(args.clients)
            rss = Rss(ours.proc.pid, pool)
            out["idle_by_kind_MiB"] = rss_by_kind(ours.proc.pid, pool)
            out["server_before"] = server_figures(ours.url)
            out["rss_before_A_MiB"] = round(status(ours.proc.pid, "VmRSS") / MiB, 1)
            attack_cfg = {
                "url": ours.url, "token": TOKEN, "cache": load.CACHE, "conversations": convs,
                "max_auth_frame_bytes": size_of(s["max_auth_frame_bytes"]),
                "max_leases_per_session": s["max_leases_per_session"],
                "slow_object_bytes": (4 if args.quick else 32) * MiB,
                "slow_readers": 4 if args.quick else 12, "names_bytes": 64 * KiB,
                "names_pool": args.names_pool, "rate": args.attack_rate,
                "silent_max_open": 300,
                "items": [i for i in args.items if convs or i not in (6, 7)]}
            out["attack_config"] = {k: v for k, v in attack_cfg.items() if k != "conversations"}
            with tqdm(total=round(2 * seconds, 1), unit="s", desc="soak A+B") as bar:
                rss.phase("A")
                out["A"] = load.mixed(clients, ours, seconds, args.lookup_clients, convs,
                                      sizes, slots, bar, seed=0, token=TOKEN)
                out["A"]["rss"] = rss.end()
                out["A"]["server"] = server_figures(ours.url)
                attackers = Attackers(attack_cfg)
                try:
                    rss.phase("B")
                    out["B"] = load.mixed(clients, ours, seconds, args.lookup_clients, convs,
                                          sizes, slots, bar, seed=0, token=TOKEN)
                finally:
                    out["attacks"] = attackers.stop()
                out["B"]["rss"] = rss.end()
                out["B"]["server"] = server_figures(ours.url)
        finally:
            if rss is not None:
                rss.stop()
            if clients is not None:
                clients.close()
            ours.stop()
    out["loadavg_end"] = os.getloadavg()
    out["verdict"] = verdict(out)
    return out


def verdict(out: dict[str, Any]) -> dict[str, Any]:
    a, b, budget = out["A"], out["B"], out["budget"]["total_MiB"]
    ratios = {k: round(v["p99_ms"] / max(a["per_op"][k]["p99_ms"], 1e-9), 2)
              for k, v in b["per_op"].items() if ":" not in k and k in a["per_op"]}
    items = out["attacks"]["items"]
    forged = items.get("6", {}).get("accepted", 0)
    checks = {
        "p99_within_3x": all(r <= P99_LIMIT for r in ratios.values()),
        "rss_within_budget": max(a["rss"]["peak_MiB"], b["rss"]["peak_MiB"],
                                 a["rss"]["VmHWM_MiB"] if a["rss"]["hwm_reset"] else 0,
                                 b["rss"]["VmHWM_MiB"] if b["rss"]["hwm_reset"] else 0)
        <= budget,
        "honest_errors_0": a["errors"] == 0 and b["errors"] == 0,
        "honest_corrupt_0": a["corrupt"] == 0 and b["corrupt"] == 0,
        "lookup_hits_kept": b["short_hits"] == 0 and b["hit_tokens"] == b["expected_tokens"],
        "forged_loads_refused": forged == 0,
        "attackers_all_ran": not out["attacks"]["alive"] and all(
            not v.get("unexpected") for v in items.values()),
    }
    return {"p99_ratio_B_over_A": ratios, "checks": checks, "pass": all(checks.values())}


def report(out: dict[str, Any], path: str) -> str:
    lines = []
    for ph, title in (("A", "A: honest load alone"), ("B", "B: same load under attack")):
        s = out[ph]
        lines.append(load.table(title, s))
        lines.append(f"  server RSS after the phase by mapping (MiB): {s['rss']['by_kind_MiB']}")
        lines.append(f"  lookups: {s['hit_tokens']} hit tokens of {s['expected_tokens']} "
                     f"expected, short hits {s['short_hits']}; server RSS peak "
                     f"{s['rss']['peak_MiB']} MiB (VmHWM {s['rss']['VmHWM_MiB']} MiB) of "
                     f"{out['budget']['total_MiB']} MiB budget")
    lines.append("budget (MiB): " + ", ".join(f"{k} {v}" for k, v in out["budget"].items())
                 + f"; idle RSS {out['idle_rss_MiB']} MiB")
    v = out["verdict"]
    lines.append("p99 B/A (limit 3x): " + ", ".join(
        f"{k} {r}x" for k, r in v["p99_ratio_B_over_A"].items()))
    for k, item in sorted(out["attacks"]["items"].items()):
        figs = ", ".join(f"{n} {x}" for n, x in item.items() if n not in ("item", "name",
                                                                           "notes"))
        lines.append(f"attack {k} {item['name']}: {figs}")
    lines.append("server after B: " + json.dumps({k: out["B"]["server"][k] for k in (
        "net", "leases", "models", "plain_names", "plain_objects_held")}))
    lines.append("checks: " + ", ".join(f"{k} {'ok' if ok else 'FAIL'}"
                                        for k, ok in v["checks"].items()))
    lines.append(f"{'PASS' if v['pass'] else 'FAIL'}; results in {path}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 s phases, small objects")
    ap.add_argument("--seconds", type=float, default=None, help="per phase (default 40)")
    ap.add_argument("--clients", type=int, default=6, help="honest client processes")
    ap.add_argument("--lookup-clients", type=int, default=2)
    ap.add_argument("--attack-rate", type=float, default=1.0, help="attackers' pace multiplier")
    ap.add_argument("--names-pool", default="anchor", choices=["kv", "state", "anchor"],
                    help="the pool item 5's PUT flood fills (anchor: not the honest data's)")
    ap.add_argument("--slack-mb", type=float, default=0.0, help="added to the RSS budget")
    ap.add_argument("--items", type=lambda v: [int(i) for i in v.split(",")],
                    default=list(range(1, 8)), help="attacks to run (default 1,2,3,4,5,6,7)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = run(args)
    path = args.json or os.path.join(_HERE, "results",
                                     f"server_soak{'_quick' if args.quick else ''}.json")
    Path(path).write_text(json.dumps(out, indent=2))
    print(report(out, path))


if __name__ == "__main__":
    main()
