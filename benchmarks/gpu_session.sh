#!/usr/bin/env bash
# One session of commprof's CUDA checks on a GPU machine with no network: installs the carried wheels
# (.whl/: HolisticTraceAnalysis, plotly, nvtx) and commprof itself, then runs benchmarks/gpu_checks.py's
# steps one after another, each in a process of its own under its own timeout, within one wall-time budget.
# Results: $OUT/gpu-session.json (every step's findings and errors), $OUT/gpu-session.log, and gpu_truth's
# files $OUT/gpu-truth-<part>.json.
#
#   OUT=out bash benchmarks/gpu_session.sh                         # in the repository root
#   OUT=out GPU_CHECKS_DEVICE=cpu bash benchmarks/gpu_session.sh   # the same steps on CPU tensors
#
# GPU_SESSION_BUDGET_S (default 400) bounds the steps' wall time together; GPU_SESSION_STEPS (default
# "tests truth hta straggler cost idioms") picks steps; PYTHON (default python3) the interpreter.
set -u
cd "$(dirname "$0")/.." || exit 1
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
LOG=$OUT/gpu-session.log
PY=${PYTHON:-python3}
BUDGET=${GPU_SESSION_BUDGET_S:-400}
STEPS=${GPU_SESSION_STEPS:-tests truth hta straggler cost idioms}
export PYTHONUNBUFFERED=1
say() { echo "$(date +%T) $*" | tee -a "$LOG"; }

# Each step's own ceiling (s), and what every later step is kept at least, whatever the earlier ones took.
declare -A CAP=([tests]=150 [truth]=100 [hta]=90 [straggler]=75 [cost]=120 [idioms]=150 [nsys]=120)
FLOOR=40

say "gpu session: $(nproc) cores, budget ${BUDGET}s, steps: $STEPS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"

# The carried wheels into a folder of their own: all at once, else one by one, so one that does not fit this
# Python (nvtx is built per Python version) leaves the rest installed.
SITE=/tmp/site
if compgen -G ".whl/*.whl" >/dev/null; then
  PIP=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE")
  if ! "${PIP[@]}" .whl/*.whl >>"$LOG" 2>&1; then
    say "wheels: together failed; one by one"
    for w in .whl/*.whl; do "${PIP[@]}" "$w" >>"$LOG" 2>&1 || say "wheel failed: $w"; done
  fi
fi
export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}

# commprof.kernels lives in kernels/ (pyproject maps it), so the checkout on PYTHONPATH alone lacks it: an
# editable install (no network: no build isolation, no dependencies); failing that, a finder that maps it.
INSTALL=present
if ! "$PY" -c "import commprof.kernels, nvtx" >>"$LOG" 2>&1; then
  if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$LOG" 2>&1 \
     && "$PY" -c "import commprof.kernels" >>"$LOG" 2>&1; then
    INSTALL=editable
  else
    INSTALL=finder
    cat >"$SITE/sitecustomize.py" <<EOF
# commprof.kernels from $PWD/kernels, as the package's installed layout has it
import importlib.abc, importlib.util, sys


class _Kernels(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "commprof.kernels":
            return None
        return importlib.util.spec_from_file_location(name, "$PWD/kernels/__init__.py",
                                                      submodule_search_locations=["$PWD/kernels"])


sys.meta_path.append(_Kernels())
EOF
  fi
fi
export GPU_SESSION_INSTALL=$INSTALL
say "commprof: $INSTALL; $("$PY" -c "import commprof.kernels, hta, nvtx; print('commprof.kernels, hta', hta.__version__, 'and nvtx import')" 2>&1 | tail -1)"

START=$(date +%s)
"$PY" benchmarks/gpu_checks.py env 2>&1 | tee -a "$LOG"

n_left() {  # steps after the one named
  local seen=0 n=0 s
  for s in $STEPS; do
    if [ $seen = 1 ]; then n=$((n + 1)); fi
    if [ "$s" = "$1" ]; then seen=1; fi
  done
  echo $n
}

for step in $STEPS; do
  now=$(date +%s)
  left=$((START + BUDGET - now - FLOOR * $(n_left "$step")))
  cap=${CAP[$step]:-60}
  t=$((left < cap ? left : cap))
  if [ "$t" -lt 20 ]; then
    say "== $step: skipped, ${t}s left for it"
    "$PY" benchmarks/gpu_checks.py note "$step" "skipped: ${t}s of the session's budget left for it" >>"$LOG" 2>&1
    continue
  fi
  say "== $step (at most ${t}s)"
  # the step stops its own children at its budget; timeout is the backstop, SIGKILL 10 s after SIGTERM
  timeout -k 10 $((t + 5)) "$PY" benchmarks/gpu_checks.py "$step" --budget "$t" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    "$PY" benchmarks/gpu_checks.py note "$step" "stopped by the session's timeout after $((t + 5))s (rc $rc)" \
      >>"$LOG" 2>&1
  fi
  say "== $step: rc $rc, $(($(date +%s) - now))s"
done
say "gpu session done in $(($(date +%s) - START))s; results: $OUT/gpu-session.json"
ls -la "$OUT" | tee -a "$LOG"
"$PY" benchmarks/gpu_checks.py summary 2>&1 | tee -a "$LOG"
