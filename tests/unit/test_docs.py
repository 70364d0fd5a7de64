"""The documentation holds: every relative link and image in README.md, docs/*.md, benchmarks/README.md and
benchmarks/studies/README.md names a file that exists (and, with an #anchor into a Markdown page, a heading
of that page, by GitHub's slug rule), and every `commprof …` command line in their code blocks is one
commprof takes — `bench` and `run` through the checks the launcher makes before any rank starts
(cli_fuzz.check, exit 0; a grid through sweep.plan, every value run by some combination), the other
commands through the parser, and the job after `commprof nsys --` as `bench` and `run` are."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest
from cli_fuzz import check

from commprof.base.errors import UsageError
from commprof.cli.commands import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
        ROOT / "benchmarks" / "studies" / "README.md", ROOT / "tools" / "README.md"]
SHELL = ("", "bash", "sh", "shell", "console")
"""Fenced code blocks whose lines are shell command lines (others: python, json)."""

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
OPERATOR = set("();<>|&")
INVOKES = re.compile(r"(^|[\s/])commprof\s+(" + "|".join(COMMANDS) + r")\b")
"""A line that may run commprof: only these (and variable assignments) are read as shell."""


def _split(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str, list[str]]]]:
    """(prose lines with their numbers, code blocks as (first line number, language, lines)); an indented
    block is one that follows a blank line, outside a fenced one."""
    prose, blocks = [], []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            mark, body, i = fence.group(1), [], i + 1
            while i < len(lines) and not lines[i].lstrip().startswith(mark):
                body.append(lines[i])
                i += 1
            blocks.append((i - len(body) + 1, fence.group(2).lower(), body))
            i += 1
            continue
        if line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            start, body = i + 1, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            blocks.append((start, "", body))
            continue
        prose.append((i + 1, line))
        i += 1
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for _, line in _split(path)[0]:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            seen.setdefault(f"{base}-{n}" if n else base, 1)
    return set(seen)


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in _split(path)[0]:
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^(https?:|mailto:)", target):
                out.append((number, target))
    return out


def test_every_page_exists():
    missing = [str(p.relative_to(ROOT)) for p in DOCS if not p.is_file()]
    assert not missing and len(DOCS) > 4, missing


def test_links_resolve():
    broken = []
    for page in DOCS:
        for number, target in links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no such heading in {dest.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    words = list(lexer)
    comment = next((i for i, w in enumerate(words) if w.startswith("#")), len(words))
    return words[:comment]


def commands(page: Path) -> list[tuple[str, list[str]]]:
    """(where and the line as written, argv after `commprof`) of every commprof command in the page's shell
    code blocks: continuations joined, shell comments and variable prefixes left out, each command of a
    `&&`, `|` or `;` chain on its own, `$VAR` expanded where the block sets VAR."""
    found = []
    for start, language, body in _split(page)[1]:
        if language not in SHELL:
            continue
        variables: dict[str, list[str]] = {}
        joined: list[tuple[int, str]] = []
        for offset, line in enumerate(body):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((start + offset, line.strip()))
        for number, line in joined:
            if not (INVOKES.search(line) or re.match(r"^[A-Za-z_]\w*=", line)):
                continue
            try:
                words, segment = _tokens(line), []
            except ValueError as exc:  # an unclosed quote
                found.append((f"{page.relative_to(ROOT)}:{number}: {line}", [f"shell: {exc}"]))
                continue
            for word in [*words, ";"]:
                if not set(word) <= OPERATOR:
                    segment.append(word)
                    continue
                assigned = [w for w in segment if re.match(r"^[A-Za-z_]\w*=", w)]
                if segment and len(assigned) == len(segment):
                    variables.update({w.split("=", 1)[0]: shlex.split(w.split("=", 1)[1]) for w in assigned})
                argv = [x for w in segment for x in (variables.get(w[1:], [w]) if w.startswith("$") else [w])]
                at = next((i for i, w in enumerate(argv[:-1])
                           if w.rsplit("/", 1)[-1] == "commprof" and argv[i + 1] in COMMANDS), None)
                if at is not None:
                    found.append((f"{page.relative_to(ROOT)}:{number}: {line}", argv[at + 1:]))
                segment = []
    return found


CASES = [case for page in DOCS if page.is_file() for case in commands(page)]


def _job(argv: list[str]) -> str | None:
    """Why `commprof bench|run <argv>` would not start its ranks, or None; a grid (or a job with --plot)
    through sweep.plan, as cli hands it there."""
    outcome = check(argv)
    return None if outcome.code == 0 else f"exit {outcome.code}: {outcome.stderr.strip()}"


@functools.cache
def _parser():
    return build_parser()


def test_commands_are_found():
    """The pages hold a command of every subcommand commprof has: an extraction that finds none fails here."""
    kinds = {argv[0] for _, argv in CASES}
    assert kinds >= set(COMMANDS), kinds


@pytest.mark.parametrize("where, argv", CASES, ids=[where.split(": ", 1)[0] for where, _ in CASES])
def test_command_parses(where, argv):
    if argv[0].startswith("shell: "):
        why = argv[0]
    elif argv[0] in ("bench", "run"):
        why = _job(argv)
    else:
        try:
            args = _parser().parse_args(argv)
        except UsageError as exc:
            why = f"the parser: {exc}"
        else:
            why = None
            if argv[0] == "nsys":
                job = args.job[1:] if args.job[:1] == ["--"] else args.job
                why = _job(job) if job[:1] in (["bench"], ["run"]) else f"no bench or run job after --: {job}"
    assert why is None, f"{where}\n  {why}"
