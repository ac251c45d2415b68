"""The ``hybrid-connector`` command (``hybrid-connector --help``); each subcommand's parser
lives beside the code it runs (``bench.cli``, ``sim.cli``, ``server.cli``, ``cli.demo``)."""

from hybrid_connector.cli.entry import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
