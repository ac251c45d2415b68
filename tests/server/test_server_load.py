"""``benchmarks/server_load.py``'s load at tiny scale: 4 client processes (3 plain LMCache
clients, 1 hybrid LOOKUP/LOAD client) for a few seconds on small objects against a server
whose host tier is smaller than the working set (so puts evict): no errors, no corrupt
read, and no tier ever above its budget (STATS sampled throughout and at the end)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from script_loader import load_script
from server_support import ROOT, served

from hybrid_connector.remote.client import admin

load = load_script(ROOT / "benchmarks" / "server_load.py")

KiB = 1 << 10
SIZES = {"anchor": 16 * KiB, "kv": 256 * KiB, "state": 1 << 20}
SLOTS = {"anchor": 8, "kv": 6, "state": 3}  # 3 plain clients: ~14 MiB of plain objects


def test_tiny_load_has_no_errors_no_corruption_and_stays_in_budget(tmp_path: Path) -> None:
    cfg = load.ours_config(tmp_path, host_kv_mb=16, state_mb=48, anchor_mb=2)
    cfg["server"] |= {"http_port": None}
    with served(cfg) as server:
        ours = SimpleNamespace(url=server.url, host=server.settings.host, port=server.port)
        convs = load.populate(server.url, 2, 600)
        assert all(c["expect"] > 0 for c in convs)  # both fit before the plain load
        clients = load.Clients(4)
        try:
            out = load.mixed(clients, ours, 5.0, 1, convs, SIZES, SLOTS)
        finally:
            clients.close()
        final = admin.stats(server.url)["tiers"]
    assert out["errors"] == 0, out["error_samples"]
    assert out["corrupt"] == 0
    per_op = out["per_op"]
    assert per_op["put"]["ops"] > 50 and per_op["get"]["ops"] > 50
    assert per_op["exist"]["ops"] > 10 and per_op["lookup"]["ops"] > 10
    b = out["budgets"]
    assert b["samples"] >= 3 and b["violations"] == 0, b
    assert b["max_use"]["host"]["kv"] > 0.5  # the budget was under pressure
    for t in final.values():
        assert all(t["used"].get(k, 0) <= cap for k, cap in t["capacity"].items())
