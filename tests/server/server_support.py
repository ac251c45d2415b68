"""Running our cache server for tests: in this process on a background event loop
(``served``), or as a real ``hybrid-connector server`` subprocess (``ServerProcess``:
SIGTERM, SIGKILL and restarts over the same NVMe directory)."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
import yaml
from fault_support import GEO, save_conversation

from hybrid_connector.core.config import HybridConfig, load_config
from hybrid_connector.remote.client.server_cache import ServerCache
from hybrid_connector.server.app import Server

ROOT = Path(__file__).resolve().parents[2]


def server_config(tmp: Path | None = None, *, host_mb: float = 64, disk_mb: float = 0,
                  **extra: Any) -> dict[str, Any]:
    """A server config dict: a host tier of ``host_mb`` (0: none) and an NVMe tier of
    ``disk_mb`` under ``tmp`` (0: none), any port, HTTP on any port; ``extra`` merged in."""
    cfg: dict[str, Any] = {"server": {"port": 0, "http_port": 0}}
    cfg["local_cpu"] = host_mb > 0
    if host_mb:
        cfg["max_local_cpu_size"] = f"{host_mb}MiB"
    if disk_mb:
        assert tmp is not None
        cfg |= {"local_disk": str(tmp / "nvme"), "max_local_disk_size": f"{disk_mb}MiB"}
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


@contextmanager
def served(config: HybridConfig | dict[str, Any]) -> Iterator[Server]:
    """A started ``Server`` on its own event loop thread; stopped (gracefully) on exit."""
    cfg = config if isinstance(config, HybridConfig) else load_config(overrides=config, environ={})
    loop = uvloop.new_event_loop()  # what `hybrid-connector server` runs on
    server = Server(cfg)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(grace=5), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def client_config(url: str, **extra: Any) -> HybridConfig:
    """An engine config in server mode against ``url``."""
    return load_config(overrides={"cache_server": {"url": url, **extra.pop("client", {})},
                                  **extra}, environ={})


def save_and_close(cfg: HybridConfig, prompt: np.ndarray, model_id: str = "") -> str:
    """One conversation (``fault_support.save_conversation``) saved by a client of its own
    in server mode (``cfg``: ``client_config``), closed before returning, so the server
    holds the objects and no session of that client; returns the model fingerprint."""
    writer = ServerCache(cfg, GEO, model_id=model_id)
    try:
        save_conversation(writer, prompt)
    finally:
        writer.close()
    return writer.fingerprint


_LISTEN = re.compile(r"listening on (hc://\S+) .*?(?:http on (http://\S+))?$")


class ServerProcess:
    """``hybrid-connector server --config PATH`` in a subprocess; ``url``/``http`` once up."""

    def __init__(self, config: dict[str, Any], workdir: Path, nofile: int | None = None) -> None:
        self.nofile = nofile  # the server's open-files limit (``ulimit -n``); None: inherited
        self.path = workdir / "server.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen[str] | None = None
        self.url = self.http = ""

    def start(self, timeout: float = 60) -> ServerProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("HYBRID_CONNECTOR_CONFIG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybrid_connector.cli", "server", "--config", str(self.path)],
            stdout=subprocess.PIPE, stderr=self.log.open("a"), text=True, env=env, cwd=ROOT,
            preexec_fn=None if self.nofile is None else self._limit_files)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if (m := _LISTEN.search(line.strip())) is not None:
                self.url, self.http = m.group(1), m.group(2) or ""
                return self
            if self.proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"server did not start: {line!r}\n{self.log.read_text()[-3000:]}")

    def _limit_files(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
