#!/usr/bin/env bash
# Build benchmarks/baseline/mpi_loop.c (the minimal MPI timing loop) into build/mpi_loop, with the mpicc of the MPI
# commprof uses: $MPICC, else the mpicc next to $PYTHON (default: python on PATH), i.e. the mpich
# wheel's in a venv. Prints the binary's path.
#
#     MPICC=.venv/bin/mpicc benchmarks/baseline/build_mpi_loop.sh [OUT]
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$here/build/mpi_loop}"
if [ -z "${MPICC:-}" ]; then
    MPICC="$(dirname "$("${PYTHON:-python}" -c 'import sys; print(sys.executable)')")/mpicc"
fi
if [ ! -x "$MPICC" ] && ! command -v "$MPICC" >/dev/null; then
    echo "build_mpi_loop: no mpicc at $MPICC (set MPICC, or PYTHON to the venv's python)" >&2
    exit 127
fi
mkdir -p "$(dirname "$out")"
"$MPICC" -O2 -Wall -Wextra -o "$out.tmp.$$" "$here/benchmarks/baseline/mpi_loop.c"
mv -f "$out.tmp.$$" "$out"
echo "$out"
