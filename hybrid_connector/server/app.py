"""``Server``: the cache server process (asyncio on uvloop): the ``hc://`` listener (LMCache's
``lm://`` framing plus the hybrid commands), the optional HTTP side, and a graceful stop.

Lifecycle: ``start`` builds nothing new (the store and the service exist from
``__init__``: a warm restart adopts what the NVMe tier holds there), binds the sockets and
returns; ``stop`` closes the listener and every connection between frames at once (an
engine's idle pooled connections hold nothing), lets the others finish their current frame
for up to ``grace`` seconds (then cancels them: their unfinished frames are dropped, nothing
half-written is indexed), waits for every queued tier op and closes the store, so the NVMe
tier is consistent and a restart serves it. SIGTERM and SIGINT call ``stop`` under
``serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hybrid_connector import assemble
from hybrid_connector.core.config import HybridConfig
from hybrid_connector.server.conn import Handler
from hybrid_connector.server.http import app
from hybrid_connector.server.memory import Trimmer
from hybrid_connector.server.metrics import Metrics
from hybrid_connector.server.reader import FrameProtocol
from hybrid_connector.server.service import Service
from hybrid_connector.tiers.store import ObjectStore

log = logging.getLogger(__name__)


class _Service(Service):
    """``Service`` whose ``stats`` also reports the connection layer (``server.net``:
    ``Handler.stats``)."""

    net: Callable[[], dict[str, int]] | None = None

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        if self.net is not None:
            out["server"]["net"] = self.net()
        return out


class Server:
    """One server over the config's tiers (or ``store``)."""

    def __init__(self, config: HybridConfig, store: ObjectStore | None = None) -> None:
        self.config = config
        self.settings = config.server
        self.store = store if store is not None else assemble.store(config, device="cpu")
        for tier in self.store.tiers:  # a long-lived server fills its host tier: fault it in
            prefault = getattr(tier, "prefault", None)
            if callable(prefault):
                prefault()
        self.service = _Service(config, self.store)
        self.metrics = Metrics(self.service.stats)
        self.handler = Handler(self.service, self.settings, self.metrics.observe)
        slack = self.settings.malloc_slack_bytes
        self.trimmer = Trimmer(int(slack)) if slack is not None else None
        self.service.net = self._net_stats
        self._trimming: asyncio.Task[None] | None = None
        self.port: int | None = None
        self.http_port: int | None = None
        self._tcp: asyncio.Server | None = None
        self._http: web.AppRunner | None = None
        self._stopped = asyncio.Event()

    def _net_stats(self) -> dict[str, int]:
        t = self.trimmer
        trims = {"malloc_trims": t.trims, "malloc_trimmed_bytes": t.freed} if t else {}
        return {**self.handler.stats(), **trims}

    async def _trim_loop(self, trimmer: Trimmer) -> None:
        """Every ``trim_interval_s``: trim the heap when due (see ``memory``)."""
        h = self.handler
        while True:
            await asyncio.sleep(self.settings.trim_interval_s)
            in_use = h.gate.used + h.auth_gate.used
            if trimmer.due(in_use):
                await h.offload(trimmer.trim, in_use)

    @property
    def url(self) -> str:
        return f"hc://{self.settings.host}:{self.port}"

    @property
    def http_host(self) -> str:
        return self.settings.http_host or self.settings.host

    async def start(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        self._tcp = await loop.create_server(lambda: FrameProtocol(self.handler, loop),
                                             s.host, s.port)
        self.port = self._tcp.sockets[0].getsockname()[1]
        if self.trimmer is not None and self.trimmer.available:
            self._trimming = asyncio.ensure_future(self._trim_loop(self.trimmer))
        if s.http_port is not None:
            tokens = [t for t in (s.token, s.admin_token) if t is not None]
            self._http = web.AppRunner(app(self.service.stats, self.metrics.registry,
                                           self.handler.offload,
                                           tokens if s.http_auth else None), access_log=None)
            await self._http.setup()
            site = web.TCPSite(self._http, self.http_host, s.http_port)
            await site.start()
            server: Any = site._server
            self.http_port = server.sockets[0].getsockname()[1]

    async def stop(self, grace: float = 10.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._tcp is not None:
            self._tcp.close()
        if self._trimming is not None:
            self._trimming.cancel()
            await asyncio.gather(self._trimming, return_exceptions=True)
        self.handler.close_idle()  # the others finish their frame within ``grace``
        tasks = list(self.handler.active)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._http is not None:
            await self._http.cleanup()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._close_sync)

    def _close_sync(self) -> None:
        self.handler.close()
        self.service.close()

    async def serve(self, ready: Callable[[Server], None] | None = None) -> None:
        """Start, call ``ready``, run until SIGTERM/SIGINT (or ``stop``), stop."""
        await self.start()
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, done.set)
        if ready is not None:
            ready(self)
        stopper = asyncio.ensure_future(self._stopped.wait())
        waiter = asyncio.ensure_future(done.wait())
        await asyncio.wait([stopper, waiter], return_when=asyncio.FIRST_COMPLETED)
        for f in (stopper, waiter):
            f.cancel()
        await self.stop()


def announce(server: Server) -> None:
    """The line tests and scripts wait for (stdout, flushed)."""
    http = f", http on http://{server.http_host}:{server.http_port}" if server.http_port else ""
    print(f"hybrid-connector server listening on {server.url} (lm:// compatible){http}",
          flush=True)
    sys.stdout.flush()


def run(config: HybridConfig) -> int:
    """Serve until a signal; returns the exit code."""
    import uvloop

    from hybrid_connector.server.memory import keep_freed_memory

    keep_freed_memory()
    async def main() -> None:
        await Server(config).serve(announce)

    uvloop.run(main())
    return 0
