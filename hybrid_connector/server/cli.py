"""``hybrid-connector server`` (run a cache server) and ``hybrid-connector ping``.

``server --config configs/server.yaml`` serves the config's tiers; flags override the
YAML (host, port, http port, token, host and NVMe sizes, NVMe path, remote URL). A size flag
scales that tier's pools in the YAML to the new total, each kind keeping its share. The token
may also come from ``HYBRID_CONNECTOR_SERVER__TOKEN`` (keep it off the command line).
Problems at start are one line on stderr, no traceback: an invalid config or a size this
machine cannot hold (``ConfigError``, exit 2, see ``hybrid_connector.tiers.machine``), an NVMe directory
another live store holds or a port in use (``OSError``, exit 1).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from hybrid_connector.core.config import ConfigError, HybridConfig, load_config
from hybrid_connector.core.config_server import DEFAULT_PORT
from hybrid_connector.core.sizes import parse_size
from hybrid_connector.remote.client.admin import ping
from hybrid_connector.remote.client.connection import ServerRefused, ServerUnavailable

log = logging.getLogger(__name__)

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
SCALED = (("host", "max_local_cpu_size"), ("disk", "max_local_disk_size"))  # size flag keys
KINDS = ("kv", "state", "anchor")


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


def scaled_pools(path: str | None, over: dict[str, Any]) -> dict[str, Any]:
    """Overrides resizing the YAML's explicit ``pools.host``/``pools.disk`` to the totals the
    size flags in ``over`` set, proportionally (integer bytes, rounded down); {} when no
    size flag meets an explicit pool. A value or file that does not load is left for the
    full load to report."""
    wanted = {}
    for tier, key in SCALED:
        if key in over:
            try:
                wanted[tier] = parse_size(over[key], 10**9)  # bare numbers are GB here
            except ValueError:
                continue
    if not wanted:
        return {}
    try:
        base = load_config(path)
    except ConfigError:
        return {}
    pools = {}
    for tier, size in wanted.items():
        pool = getattr(base.pools, tier)
        if pool is not None and pool.total:
            pools[tier] = {k: getattr(pool, k) * size // pool.total for k in KINDS}
    return {"pools": pools} if pools else {}


def config_of(args: argparse.Namespace) -> HybridConfig:
    """The config ``server`` runs: the YAML, the env, the flags (size flags scaling pools)."""
    over = overrides(args)
    return load_config(args.config, {**over, **scaled_pools(args.config, over)})


SERVER_HELP = """\
Run a cache server that several engines (vLLM, SGLang, transformers) share over hc://; it
also speaks lmcache_server's lm:// protocol. Flags override the YAML; a size flag scales
that tier's pools, each kind keeping its share. Prefer HYBRID_CONNECTOR_SERVER__TOKEN to
--token so the secret stays off the command line."""

SERVER_EXAMPLES = """\
examples:
  hybrid-connector server --config configs/server.yaml
  hybrid-connector server --config configs/server.yaml --port 7000 --http-port 9100
  hybrid-connector server --host-size 16GB --disk /mnt/nvme/hc --disk-size 200GB"""

PING_HELP = "Check that a cache server answers and print the round trip time (exit 1 if not)."
PING_EXAMPLES = """\
examples:
  hybrid-connector ping hc://127.0.0.1:65432
  hybrid-connector ping hc://cache-host:7000 --token "$TOKEN" --timeout 2"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("server", help="run a cache server (lm:// compatible) for several engines",
                       description=SERVER_HELP, epilog=SERVER_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config (tiers, policies, the server section)")
    for flag, _, text in FLAGS:
        p.add_argument(flag, help=text, type=int if flag in INT_FLAGS else str, default=None)
    p.set_defaults(func=run)


def add_ping_parser(sub: Any) -> None:
    p = sub.add_parser("ping", help="check that a cache server answers (HEALTH round trip)",
                       description=PING_HELP, epilog=PING_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="hc://host:port")
    p.add_argument("--token", default=None, help="the server's token, if it requires one")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    p.set_defaults(func=run_ping)


def run(args: argparse.Namespace) -> int:
    from hybrid_connector.server.app import run as serve

    config = config_of(args)
    try:
        return serve(config)
    except OSError as exc:  # hybrid_connector.tiers.dirlock.DirectoryLocked included
        log.debug("server failed", exc_info=True)  # the traceback with -v
        print(f"hybrid-connector server: {exc}", file=sys.stderr)
        return 1


def run_ping(args: argparse.Namespace) -> int:
    try:
        seconds = ping(args.url, args.token, args.timeout)
    except (ServerUnavailable, ServerRefused, ValueError) as exc:
        print(f"hybrid-connector ping: {args.url}: {exc}")
        return 1
    print(f"{args.url}: ok in {seconds * 1e3:.2f} ms")
    return 0
