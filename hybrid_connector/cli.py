"""``hybrid-connector`` command: demo, inspect, simulate, gen-trace (and more as they land).

Each subcommand lives in its own module exposing ``add_parser(subparsers)``; modules
whose optional dependencies are missing are left out of the menu.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# (module, parser hook) pairs; each hook registers one subcommand with ``func=run``.
COMMANDS = (
    ("hybrid_connector.demo", "add_parser"),
    ("hybrid_connector.inspect_cmd", "add_parser"),
    ("hybrid_connector.sim.cli", "add_parser"),
    ("hybrid_connector.sim.cli", "add_gen_parser"),
    ("hybrid_connector.server.cli", "add_parser"),
    ("hybrid_connector.bench_cli", "add_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybrid-connector", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for module, hook in COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # that subcommand is not part of this build
            raise
        fn = getattr(mod, hook, None)
        if fn is not None:
            fn(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
