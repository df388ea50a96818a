"""The ``hindsearch`` command line.

Each stage's commands live in one module of this package (``data``, ``retrieval``, ``eval``,
``train``, ``probe``, ``report``, ``compare``) with ``register(subparsers)``; the argument types
they share are in ``args``. This module only collects them, so ``hindsearch --help`` stays fast
(heavy imports happen inside the command functions). The package is the top layer: it wires the
stages, which never import it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that define ``register(subparsers)``; each adds one or more subcommands.
COMMAND_MODULES = (
    "hindsearch.cli.data",
    "hindsearch.cli.retrieval",
    "hindsearch.cli.eval",
    "hindsearch.cli.train",
    "hindsearch.cli.probe",
    "hindsearch.cli.report",
    "hindsearch.cli.compare",
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hindsearch")
    except PackageNotFoundError:
        return "unknown (not installed)"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default: ``(default: X)``, ``(default: off)`` for a switch, ``(default:
    none)`` when unset, unless the help text already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        if "default" in h or action.required or not action.option_strings:
            return h
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return (h + " (default: off)" if isinstance(action, argparse._StoreTrueAction) else h
                    + " (default: on)")
        if action.default is argparse.SUPPRESS:
            return h
        if action.default is None or action.default == []:
            return h + " (default: none)"
        return h + " (default: %(default)s)"


def _finish(parser: argparse.ArgumentParser, help_text: str | None) -> None:
    """Every (sub)command: a description, defaults shown in ``--help``, and ``--debug``."""
    if not parser.description and help_text:
        parser.description = help_text[0].upper() + help_text[1:] + "."
    parser.formatter_class = HelpFormatter
    if "--debug" not in parser._option_string_actions:
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                            help="on an error, show the full traceback instead of one line")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                _finish(sub, helps.get(name))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hindsearch",
        description="Train and evaluate Search-R1 agents with GRPO, HindSearch and IGSD.",
    )
    parser.add_argument("--version", action="version", version=f"hindsearch {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # stage not present in this build
                continue
            raise
        mod.register(sub)
    _finish(parser, None)
    return parser


OUTPUT_ARGS = ("out", "resume")
"""Flags naming a folder or file a command writes: their ``~`` is expanded here, once, for every
command (``fsutil.expand_out``), so nothing writes to a literal ``./~``."""


def expand_output_args(args: argparse.Namespace) -> None:
    from hindsearch.fsutil import expand_out

    for name in OUTPUT_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.startswith("~"):
            setattr(args, name, str(expand_out(value)))


EXPECTED = (ValueError, OSError, ConnectionError, RuntimeError, LookupError)
"""Errors that carry a message meant for the user; anything else is also one line, marked
unexpected."""


def describe(e: BaseException) -> str:
    """One line for an error: its message, with the path an ``OSError`` names when the message lacks
    it."""
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in str(
            e.args[-1] if e.args else ""):
        what = e.strerror or type(e).__name__
        path = f"{e.filename} -> {e.filename2}" if e.filename2 else str(e.filename)
        msg = f"{path}: {what}"
        if isinstance(e, (FileExistsError, NotADirectoryError)):
            msg += " (a file is in the way of a folder, or the other way round)"
        elif isinstance(e, PermissionError):
            msg += " (choose a folder you can write to)"
    else:
        msg = str(e) or type(e).__name__
        if isinstance(e, KeyError):
            msg = f"missing key {msg}"
    line = " ".join(msg.split())
    if not isinstance(e, EXPECTED) or isinstance(e, RecursionError):
        line = f"{type(e).__name__}: {line} (unexpected; run again with --debug for the traceback)"
    return line[:2000]


def main(argv: list[str] | None = None) -> int:
    from hindsearch.memory import tune_malloc

    # before torch loads and starts threads: fewer malloc arenas, big tensors go back to the kernel
    tune_malloc()
    from hindsearch.progress import quiet_upstream_bars

    # off a terminal, no upstream bar redraws in the log (before transformers is imported)
    quiet_upstream_bars()
    from hindsearch import upstream_warnings

    # known upstream deprecation notices once each, with a note; others untouched
    upstream_warnings.install()
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    try:  # an action runs while parsing (--plugin imports its plugin): its error is one line too
        args = parser.parse_args(words)
    except Exception as e:
        if "--debug" in words:
            raise
        command = next((w for w in words if not w.startswith("-")), "")
        print(f"hindsearch{' ' + command if command else ''}: error: {describe(e)}",
              file=sys.stderr)
        return 1
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    expand_output_args(args)
    try:
        rc = args.func(args)
    # Ctrl-C, or a command's own stop (a run's TrainingStopped says what it kept)
    except KeyboardInterrupt as e:
        print(f"hindsearch {args.command}: {e}" if str(e)
              else "interrupted; finished work is kept and a rerun resumes it", file=sys.stderr)
        return int(getattr(e, "exit_code", 130))
    except Exception as e:  # one line, never a traceback, unless --debug
        if getattr(args, "debug", False):
            raise
        print(f"hindsearch {args.command}: error: {describe(e)}", file=sys.stderr)
        return 1
    # under accelerate launch: a clean exit, not gloo's SIGABRT at teardown
    if "torch.distributed" in sys.modules:
        from hindsearch.core import lockstep

        lockstep.close()
    return int(rc or 0)


def entry() -> None:
    """The ``hindsearch`` console script (and ``python -m hindsearch.cli``): ``main``, then the
    exit. A rank of a multi-process launch (``WORLD_SIZE`` > 1) whose command ended well leaves
    through ``lockstep.end_process`` (no interpreter finalisation, where gloo's threads can abort a
    finished rank); everything else exits normally. ``main`` itself only returns, so it stays
    callable from Python and tests."""
    import os

    rc = main()
    if rc == 0 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from hindsearch.core import lockstep

        lockstep.end_process(rc)
    sys.exit(rc)

