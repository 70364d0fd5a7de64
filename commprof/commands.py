"""The `commprof` subcommands and their parser: which module registers each command's flags, built so that a
command loads no module it does not use. cli.py turns what the parser refuses into one line; sweep.py parses
each job of a grid with it.

Exercised by: `pytest tests/unit/test_cli_grammar.py tests/unit/test_layout.py`.
"""

from __future__ import annotations

import argparse
import importlib

from commprof import __version__
from commprof.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; main says it in one line
        raise UsageError(message)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            # Python < 3.13 stores [] for a flag given "--" as its value (--model=--), where a str belongs.
            if action.option_strings and action.nargs is None and getattr(namespace, action.dest, None) == []:
                self.error(f"argument {'/'.join(action.option_strings)}: expected one argument")
        return namespace, extras


COMMANDS = {
    "bench": ("commprof.bench.command", "sweep collectives over sizes (nccl-tests semantics)"),
    "run": ("commprof.run.command", "profile one training strategy: compute/comm split and volume"),
    "profile": ("commprof.profile.command", "profile an unchanged torch.distributed training script"),
    "nsys": ("commprof.nsys", "profile a commprof job with Nsight Systems (one report per rank)"),
    "report": ("commprof.report.command", "tables and plots of saved bench, run and grid results"),
    "predict": ("commprof.predict.command", "step time at N ranks from a traced run and a fabric's α and β"),
}
"""Each subcommand: the module whose `add_parser(subparsers, summary)` registers its flags, and its help line."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` set, the flags of that subcommand alone: the others are names
    and help lines, so `commprof --help` and every command load no module they do not use (torch takes
    seconds to import). `only=""` registers no subcommand's flags."""
    parser = _Parser(prog="commprof", description="Low-level communication profiler for distributed training.")
    parser.add_argument("--version", action="version", version=f"commprof {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (module, summary) in COMMANDS.items():
        if only is None or only == name:
            importlib.import_module(module).add_parser(subparsers, summary)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


def parse(argv: list[str], chosen: str) -> argparse.Namespace:
    """argv as the subcommand `chosen` reads it; raises UsageError."""
    args = build_parser(chosen if chosen in COMMANDS else "").parse_args(argv)
    args.argv = argv
    return args
