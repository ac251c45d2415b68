"""``hybrid-connector`` command: demo, inspect, simulate, gen-trace, server, ping, bench.

Each subcommand lives in its own module exposing a parser hook ``hook(subparsers)`` that
registers it with ``func=run``. ``COMMANDS`` lists only modules that exist (the server and
bench commands are added with their modules); a listed module that fails to import, or
lacks its hook, is an error naming it, never a silently missing command.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from hybrid_connector.core.config import ConfigError

DESCRIPTION = """\
A prefix cache and offload connector for hybrid LLMs (attention + Mamba/GDN layers):
KV chunks and recurrent-state checkpoints in tiers (GPU, host RAM, NVMe, a remote store)."""

EPILOG = """\
examples:
  hybrid-connector bench capacity                       # the main benchmark (CPU, minutes)
  hybrid-connector demo                                 # a multi-turn trace through the cache
  hybrid-connector inspect --config configs/vllm.yaml --model qwen3.5-4b
  hybrid-connector server --config configs/server.yaml  # a cache server for several engines
  hybrid-connector ping hc://127.0.0.1:65432

'hybrid-connector COMMAND --help' describes one command's options."""

# (module, parser hook) pairs; each hook registers one subcommand with ``func=run``.
COMMANDS = (
    ("hybrid_connector.cli.demo", "add_parser"),
    ("hybrid_connector.cli.inspect_cmd", "add_parser"),
    ("hybrid_connector.sim.cli", "add_parser"),
    ("hybrid_connector.sim.cli", "add_gen_parser"),
    ("hybrid_connector.server.cli", "add_parser"),
    ("hybrid_connector.server.cli", "add_ping_parser"),
    ("hybrid_connector.bench.cli", "add_parser"),
)


class CommandLoadError(RuntimeError):
    """A module listed in ``COMMANDS`` could not be imported or lacks its parser hook."""


def build_parser() -> argparse.ArgumentParser:
    """The full parser; raises ``CommandLoadError`` naming the module that failed."""
    parser = argparse.ArgumentParser(prog="hybrid-connector", description=DESCRIPTION,
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands")
    for module, hook in COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise CommandLoadError(
                f"command module {module} failed to import: {type(exc).__name__}: {exc}"
            ) from exc
        fn = getattr(mod, hook, None)
        if not callable(fn):
            raise CommandLoadError(f"command module {module} has no parser hook {hook}()")
        fn(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns its exit code. 1: the CLI itself cannot load (a
    command module is broken), 2: bad arguments or an invalid config (argparse exits 2
    itself for unknown options)."""
    try:
        parser = build_parser()
    except CommandLoadError as exc:
        print(f"hybrid-connector: {exc}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"hybrid-connector {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
