"""``hybrid-connector server`` on this machine: the README's command starts the shipped
config, size flags scale the pools, sizes the machine cannot hold and an NVMe directory a
live server holds are one-line errors (no traceback, non-zero exit)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from server_support import ServerProcess
from tier_servers import free_port

from hybrid_connector.cli import build_parser
from hybrid_connector.remote.client.admin import ping
from hybrid_connector.server.cli import config_of
from hybrid_connector.tiers.machine import check_sizes

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    """This environment without config env vars (they would override the files)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HYBRID_CONNECTOR_")}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hybrid_connector.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env())


def mem_total() -> int:
    """MemTotal from /proc/meminfo, in bytes (what psutil reports as total)."""
    m = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    assert m is not None
    return int(m.group(1)) * 1024


def readme_server_command() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Cache server"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    line = next(x for x in block.group(1).splitlines() if " server " in x)
    argv = shlex.split(line.split("#")[0])
    assert argv[0] == ".venv/bin/hybrid-connector" and argv[1] == "server", argv
    return argv[2:]


def test_the_readme_server_command_starts_on_this_machine(tmp_path: Path) -> None:
    args = readme_server_command()
    cfg = config_of(build_parser().parse_args(["server", *args]))
    check_sizes(cfg)  # the shipped sizes fit here, local_disk as written included
    port, http = free_port(), free_port()
    # as written, but on free ports and a private directory (a live server locks its own)
    cmd = [sys.executable, "-m", "hybrid_connector.cli", "server", *args, "--host",
           "127.0.0.1", "--port", str(port), "--http-port", str(http),
           "--disk", str(tmp_path / "nvme")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, env=env(),
                            stderr=(tmp_path / "err.log").open("w"), text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the announcement, or "" if it died
        assert f"listening on hc://127.0.0.1:{port}" in line, (
            line, (tmp_path / "err.log").read_text()[-3000:])
        assert ping(f"hc://127.0.0.1:{port}", None, 30.0) > 0
        proc.terminate()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()
    assert "Traceback" not in (tmp_path / "err.log").read_text()


def big_config(tmp_path: Path) -> Path:
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({
        "max_local_cpu_size": "40GB", "local_disk": str(tmp_path / "nvme"),
        "max_local_disk_size": "500GB",
        "pools": {"host": {"kv": "24GB", "state": "12GB", "anchor": "4GB"},
                  "disk": {"kv": "300GB", "state": "150GB", "anchor": "50GB"}},
        "server": {"port": 0}}))
    return path


def test_size_flags_scale_the_pools(tmp_path: Path) -> None:
    args = build_parser().parse_args(["server", "--config", str(big_config(tmp_path)),
                                      "--host-size", "2GB", "--disk-size", "5"])
    cfg = config_of(args)
    assert cfg.max_local_cpu_size == 2 * 10**9 and cfg.max_local_disk_size == 5 * 10**9
    host, disk = cfg.pools.host, cfg.pools.disk
    assert host is not None and disk is not None
    assert (host.kv, host.state, host.anchor) == (1_200_000_000, 600_000_000, 200_000_000)
    assert (disk.kv, disk.state, disk.anchor) == (3 * 10**9, 1_500_000_000, 500_000_000)


@pytest.mark.parametrize("key", ["max_local_cpu_size", "pools.host"])
def test_a_host_size_beyond_the_machine_is_a_clean_config_error(tmp_path: Path, key: str
                                                                 ) -> None:
    mem = mem_total()
    cfg: dict[str, object] = {"server": {"port": 0}, "max_local_cpu_size": f"{2 * mem}B"}
    if key == "pools.host":
        cfg["pools"] = {"host": {"kv": f"{mem}B", "state": f"{mem // 2}B"}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = cli("server", "--config", str(path))
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr
    assert f"{key} (" in r.stderr and "exceeds this machine's memory" in r.stderr, r.stderr
    assert f"({mem} B = " in r.stderr, r.stderr  # the machine's figure


def test_a_disk_size_beyond_the_free_space_is_a_clean_config_error(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    r = cli("server", "--config", str(big_config(tmp_path)), "--host-size", "64MB",
            "--disk-size", f"{2 * free + 10**12}B")
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr
    assert "pools.disk (" in r.stderr and str(tmp_path / "nvme") in r.stderr, r.stderr
    got = re.search(r"its filesystem has (\d+) B = [\d.]+ GB free", r.stderr)
    assert got is not None, r.stderr
    assert abs(int(got.group(1)) - free) < max(free // 10, 1 << 30)  # others write too
    assert not (tmp_path / "nvme").exists()  # refused before anything was created


def test_a_second_server_on_a_live_directory_is_refused(tmp_path: Path) -> None:
    disk = tmp_path / "nvme"
    first = {"server": {"port": 0}, "max_local_cpu_size": "64MiB",
             "local_disk": str(disk), "max_local_disk_size": "64MiB"}
    with ServerProcess(first, tmp_path) as a:
        assert a.proc is not None
        assert ping(a.url, None, 30.0) > 0
        r = cli("server", "--config", str(a.path), "--port", "0")
        assert r.returncode == 1, r
        assert "Traceback" not in r.stderr
        assert str(disk) in r.stderr and f"pid {a.proc.pid}" in r.stderr, r.stderr
        assert ping(a.url, None, 30.0) > 0  # the first one serves on
        assert a.terminate() == 0
    with ServerProcess(first, tmp_path) as b:  # stopped: the directory is free again
        assert ping(b.url, None, 30.0) > 0
        assert b.terminate() == 0
