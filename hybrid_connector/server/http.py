"""The server's HTTP side (aiohttp, same event loop): ``/health``, ``/stats`` (JSON, what
``STATS`` returns) and ``/metrics`` (Prometheus text of ``registry``). ``offload`` runs a
blocking call off the event loop (the server's worker threads)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Offload = Callable[..., Awaitable[Any]]


def app(stats: Callable[[], dict[str, Any]], registry: CollectorRegistry,
        offload: Offload) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def stats_json(_: web.Request) -> web.Response:
        data = await offload(stats)
        return web.Response(text=json.dumps(data, default=str), content_type="application/json")

    async def metrics(_: web.Request) -> web.Response:
        body = await offload(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    a = web.Application()
    a.add_routes([web.get("/health", health), web.get("/stats", stats_json),
                  web.get("/metrics", metrics)])
    return a
