"""The `commprof` subcommands and their parser: which module registers each command's flags, built so that a
command loads no module it does not use. cli.py turns what the parser refuses into one line; sweep.py parses
each job of a grid with it.

`--help` is drawn by HelpFormatter, within 80 columns.

Exercised by: `pytest tests/unit/test_cli_grammar.py tests/unit/test_layout.py tests/unit/test_help_text.py`.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import textwrap

from commprof import __version__
from commprof.base.errors import UsageError

HELP_COLUMNS = 80
"""The widest `--help` gets, however wide the terminal: narrower where COLUMNS or the terminal says so."""


class HelpFormatter(argparse.HelpFormatter):
    """`--help` as users read it, within HELP_COLUMNS: prose is wrapped to the width; an indented line (an
    example command) keeps its line, and one wider than the width goes on in a deeper indent."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:  # argparse's own rule (the terminal's columns, less 2), capped
            width = min(shutil.get_terminal_size().columns, HELP_COLUMNS) - 2
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                out.extend(textwrap.wrap(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent,
                                         break_on_hyphens=False))
                prose.clear()

        for line in textwrap.dedent(text).strip("\n").splitlines():
            if not line.strip():
                flush()
                out.append("")
            elif line[0].isspace():
                flush()
                lead = line[:len(line) - len(line.lstrip())]
                out.extend(textwrap.wrap(line.strip(), width, initial_indent=indent + lead,
                                         subsequent_indent=indent + lead + "    ", break_on_hyphens=False))
            else:
                prose.append(line.strip())
        flush()
        return "\n".join(out)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

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
    "nsys": ("commprof.cli.nsys", "profile a commprof job with Nsight Systems (one report per rank)"),
    "report": ("commprof.report.command", "tables and plots of saved bench, run and grid results"),
    "predict": ("commprof.predict.command", "step time at N ranks from a traced run and a fabric's α and β"),
}
"""Each subcommand: the module whose `add_parser(subparsers, summary)` registers its flags, and its help line."""


EPILOG = """\
`commprof COMMAND --help` gives a command's flags and examples. Exit codes: 0 success, 1 wrong results or a
backend failure, 2 bad input or an unsupported request, 3 a peer rank that stalled, died or was killed, 4 ranks
that called different collectives (desync), 130 interrupted. COMMPROF_DEBUG=1 shows tracebacks."""
"""`commprof --help`'s last paragraph."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` set, the flags of that subcommand alone: the others are names
    and help lines, so `commprof --help` and every command load no module they do not use (torch takes
    seconds to import). `only=""` registers no subcommand's flags."""
    parser = _Parser(prog="commprof", description="Low-level communication profiler for distributed training.",
                     epilog=EPILOG)
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
