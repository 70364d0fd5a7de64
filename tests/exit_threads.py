"""A rank wrapper (COMMPROF_RANK_WRAPPER) for tests/test_failures.py: runs one commprof rank in this
process, then prints the Python threads still alive as the interpreter is about to finalize. A thread
inside a torch call then (pytorch issue 38228) ends the process with "terminate called without an
active exception": commprof must have ended all of its own by then."""

import os
import runpy
import sys
import threading

# the launcher puts this in front of its rank command: PYTHON -m commprof ARGS...
sys.argv = ["commprof", *sys.argv[sys.argv.index("commprof") + 1:]]
code = 0
try:
    runpy.run_module("commprof", run_name="__main__")
except SystemExit as exc:
    code = exc.code
alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
print(f"rank {os.environ.get('PMI_RANK', os.environ.get('RANK'))} threads at exit: {alive}", flush=True)
sys.exit(code)
