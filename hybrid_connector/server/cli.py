"""``hybrid-connector server`` (run a cache server) and ``hybrid-connector ping``.

``server --config configs/server.yaml`` serves the config's tiers; flags override the
YAML (host, port, http port, token, host and NVMe sizes, NVMe path, remote URL). The token
may also come from ``HYBRID_CONNECTOR_SERVER__TOKEN`` (keep it off the command line).
"""

from __future__ import annotations

import argparse
from typing import Any

from hybrid_connector.client.admin import ping
from hybrid_connector.client.connection import ServerRefused, ServerUnavailable
from hybrid_connector.config import load_config
from hybrid_connector.config_server import DEFAULT_PORT

FLAGS = (  # flag, config path, help
    ("--host", ("server", "host"), "address to bind (default 127.0.0.1)"),
    ("--port", ("server", "port"), f"port to listen on (default {DEFAULT_PORT}; 0: any)"),
    ("--http-port", ("server", "http_port"), "port of /health, /stats, /metrics (default off)"),
    ("--token", ("server", "token"), "shared secret clients must present"),
    ("--host-size", ("max_local_cpu_size",), "host RAM tier size, e.g. 8GB"),
    ("--disk", ("local_disk",), "NVMe tier directory"),
    ("--disk-size", ("max_local_disk_size",), "NVMe tier size, e.g. 100GB"),
    ("--remote", ("remote_url",), "shared remote tier (lm://, redis://)"),
)
INT_FLAGS = {"--port", "--http-port"}


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, path, _ in FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is None:
            continue
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def add_parser(sub: Any) -> None:
    p = sub.add_parser("server", help="run a cache server (lm:// compatible) for several engines")
    p.add_argument("--config", help="YAML config (tiers, policies, the server section)")
    for flag, _, text in FLAGS:
        p.add_argument(flag, help=text, type=int if flag in INT_FLAGS else str, default=None)
    p.set_defaults(func=run)


def add_ping_parser(sub: Any) -> None:
    p = sub.add_parser("ping", help="check that a cache server answers (HEALTH round trip)")
    p.add_argument("url", help="hc://host:port")
    p.add_argument("--token", default=None)
    p.add_argument("--timeout", type=float, default=5.0)
    p.set_defaults(func=run_ping)


def run(args: argparse.Namespace) -> int:
    from hybrid_connector.server.app import run as serve

    return serve(load_config(args.config, overrides(args)))


def run_ping(args: argparse.Namespace) -> int:
    try:
        seconds = ping(args.url, args.token, args.timeout)
    except (ServerUnavailable, ServerRefused, ValueError) as exc:
        print(f"hybrid-connector ping: {args.url}: {exc}")
        return 1
    print(f"{args.url}: ok in {seconds * 1e3:.2f} ms")
    return 0
