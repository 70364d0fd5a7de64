"""`python -m commprof …` is the same as the `commprof` console script (the launcher uses it)."""

import sys

from commprof.cli import main

sys.exit(main())
