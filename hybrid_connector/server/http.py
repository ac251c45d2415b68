"""The server's HTTP side (aiohttp, same event loop): ``/health``, ``/stats`` (JSON, what
``STATS`` returns) and ``/metrics`` (Prometheus text of ``registry``). ``offload`` runs a
blocking call off the event loop (the server's worker threads).

It listens on ``server.http_host`` (default: ``server.host``) at ``server.http_port``.
``/stats`` and ``/metrics`` answer anyone who reaches that address unless ``tokens`` is
given (``server.http_auth``): then they need ``Authorization: Bearer <one of tokens>`` (401
otherwise); ``/health`` always answers (a liveness probe learns nothing from it).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Offload = Callable[..., Awaitable[Any]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bearer_ok(header: str | None, tokens: Sequence[str]) -> bool:
    """Does an ``Authorization`` header carry one of ``tokens`` as a bearer token?"""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    # compare with every token, so the time taken does not say which one nearly matched
    return sum(hmac.compare_digest(given.strip().encode(), t.encode()) for t in tokens) > 0


def app(stats: Callable[[], dict[str, Any]], registry: CollectorRegistry,
        offload: Offload, tokens: Sequence[str] | None = None) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def stats_json(_: web.Request) -> web.Response:
        data = await offload(stats)
        return web.Response(text=json.dumps(data, default=str), content_type="application/json")

    async def metrics(_: web.Request) -> web.Response:
        body = await offload(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @web.middleware
    async def need_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (tokens is not None and request.path != "/health"
                and not bearer_ok(request.headers.get("Authorization"), tokens)):
            return web.json_response({"error": "Authorization: Bearer <token> required"},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    a = web.Application(middlewares=[need_token])
    a.add_routes([web.get("/health", health), web.get("/stats", stats_json),
                  web.get("/metrics", metrics)])
    return a
