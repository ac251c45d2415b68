"""``benchmarks/server_soak.py`` at tiny scale: the honest mixed load (token-authenticated
plain and hybrid clients) alone, then beside issue 25's attackers 1-7 at once, completes
with no honest error, no corrupt read and no lookup hit lost, every attacker having run
and been refused what the hardening refuses. Speed and RSS are the full run's business
(they depend on the machine's load), not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from server_support import ROOT


def test_the_soak_completes_with_no_honest_error_under_every_attack(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "server_soak.py"), "--quick",
         "--seconds", "3", "--clients", "3", "--lookup-clients", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for phase in ("A", "B"):
        s = res[phase]
        assert s["errors"] == 0 and s["corrupt"] == 0, (phase, s["error_samples"])
        assert s["per_op"]["get"]["ops"] > 0 and s["per_op"]["lookup"]["ops"] > 0, phase
        assert s["short_hits"] == 0 and s["hit_tokens"] == s["expected_tokens"] > 0, phase
    attacks = res["attacks"]
    assert attacks["alive"] == [] and sorted(attacks["items"]) == [str(i) for i in range(1, 8)]
    items = attacks["items"]
    assert all(not v.get("unexpected") for v in items.values()), items
    assert items["1"]["frames"] > 0 and items["1"]["closed_by_server"] == items["1"]["frames"]
    assert items["2"]["opened"] > 0 and items["3"]["gets_never_read"] > 0
    assert items["4"]["hellos"] > 0 and items["5"]["puts"] > 0
    assert items["6"]["forged_loads"] > 0 and items["6"].get("accepted", 0) == 0, items["6"]
    assert items["7"]["acquired"] > 0
    server = res["B"]["server"]
    assert server["models"] <= res["server_config"]["server"]["max_models"], server
    assert server["plain_names"] == server["plain_objects_held"], server
    assert "PASS" in proc.stdout or "FAIL" in proc.stdout  # the report was printed
