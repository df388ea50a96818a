"""The ``hindsearch`` command line.

Each stage owns a small ``cli`` module with ``register(subparsers)``; this file only
collects them, so ``hindsearch --help`` stays fast (heavy imports happen inside the
command functions).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that define ``register(subparsers)``; each adds one or more subcommands.
COMMAND_MODULES = (
    "hindsearch.data.cli",
    "hindsearch.retrieval.cli",
    "hindsearch.agent.cli",
    "hindsearch.train.cli",
    "hindsearch.report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hindsearch",
        description="Train and evaluate Search-R1 agents with GRPO, HindSearch and IGSD.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # stage not present in this build
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted; finished work is kept and a rerun resumes it", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, ConnectionError, RuntimeError) as e:
        if getattr(args, "debug", False):
            raise
        print(f"hindsearch {args.command}: error: {e}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
