#!/usr/bin/env bash
# The package as a user gets it: build the wheel from this checkout, check that it holds every module
# (tools/wheel_modules.py), install it without -e into a clean venv outside the checkout, and run one short
# bench, run and profile from there. Each prints its own figures; any failure exits non-zero.
#
#   tools/wheel_check.sh [WORKDIR]       # default: a new temporary folder, removed at the end
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ge 1 ]; then work=$(realpath -m "$1"); mkdir -p "$work"; else
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi

python3 -m pip wheel -q --no-deps -w "$work/dist" "$root"
python3 "$root/tools/wheel_modules.py" "$work"/dist/commprof-*.whl
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/commprof-*.whl

cd "$work"  # outside the checkout: only the installed package can be imported
where=$("$work/venv/bin/python" -c "import commprof, commprof.kernels, commprof.findings; print(commprof.__file__)")
case "$where" in "$work/venv/"*) echo "wheel_check: commprof imported from $where" ;;
    *) echo "wheel_check: commprof imported from $where, not from the installed wheel" >&2; exit 1 ;; esac
export OMP_NUM_THREADS=1
"$work/venv/bin/commprof" bench all_reduce -b 1K -e 4K -f 4 -n 5 -w 1 --nproc 2
"$work/venv/bin/commprof" run --strategy ddp --nproc 2 --steps 3 --warmup 1 --eval-samples 0
"$work/venv/bin/commprof" profile --nproc 2 --warmup 1 -- "$root/tests/scripts/ddp_train.py" --steps 3
echo "wheel_check: bench, run and profile ran from the installed wheel"
