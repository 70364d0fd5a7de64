"""`python -m commprof …` is the same as the `commprof` console script (the launcher uses it)."""

from commprof.cli.main import entry

entry()
