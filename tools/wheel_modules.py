"""A built wheel holds every module of the source tree: each .py file under commprof/ and kernels/ (the latter
as commprof/kernels/), so an installed commprof imports all that its code imports. Nothing is installed.

    python tools/wheel_modules.py dist/commprof-*.whl

Exit 0 and one line with the count; exit 1 and one line naming what the wheel lacks.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"commprof": "commprof", "kernels": "commprof/kernels"}
"""Source folder -> where its files sit in the wheel (pyproject/setup.py install kernels/ as commprof.kernels)."""


def expected() -> set[str]:
    """Every module file the wheel must hold, by its path inside the wheel."""
    found = set()
    for folder, target in SOURCES.items():
        for path in (ROOT / folder).rglob("*.py"):
            found.add(f"{target}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/wheel_modules.py WHEEL", file=sys.stderr)
        return 2
    try:
        held = set(zipfile.ZipFile(argv[0]).namelist())
    except (OSError, zipfile.BadZipFile) as e:
        print(f"wheel_modules: cannot read {argv[0]}: {e}", file=sys.stderr)
        return 2
    missing = sorted(expected() - held)
    if missing:
        folders = sorted({m.rsplit("/", 1)[0] for m in missing})
        print(f"wheel_modules: {argv[0]} lacks {len(missing)} module(s) in {', '.join(folders)} "
              f"(e.g. {missing[0]})", file=sys.stderr)
        return 1
    print(f"wheel_modules: {Path(argv[0]).name} holds all {len(expected())} modules of commprof/ and kernels/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
