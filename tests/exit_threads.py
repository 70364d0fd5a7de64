"""A rank wrapper (COMMPROF_RANK_WRAPPER) for tests/test_failures.py: runs one commprof rank in this process and
prints the Python threads still alive as the rank ends (into EXIT_THREADS_DIR/rank<r>.txt where that is set: a
line written after MPI_Finalize was lost once on its way through mpiexec's forwarding). A rank ends through
commprof.comm.end_process (os._exit, after its Comm is closed), so this wraps os._exit: commprof must have ended
its own threads by then — the watchdog's — or they would be cut off mid-write."""

import os
import runpy
import sys
import threading

_exit = os._exit


def _report_and_exit(code: int) -> None:
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    # One write of the whole line: print() under PYTHONUNBUFFERED writes the text and its newline apart,
    # and mpiexec's forwarding can put the other rank's line between them.
    sys.stdout.flush()
    line = f"rank {os.environ.get('PMI_RANK', os.environ.get('RANK'))} threads at exit: {alive}\n".encode()
    folder = os.environ.get("EXIT_THREADS_DIR")
    if folder:  # a file of the rank's own: after MPI_Finalize, mpiexec may have stopped forwarding its stdout
        with open(os.path.join(folder, f"rank{os.environ.get('PMI_RANK', os.environ.get('RANK'))}.txt"), "wb") as f:
            f.write(line)
    else:
        os.write(1, line)
    _exit(code)


os._exit = _report_and_exit
# the launcher puts this in front of its rank command: PYTHON -m commprof ARGS...
sys.argv = ["commprof", *sys.argv[sys.argv.index("commprof") + 1:]]
try:
    runpy.run_module("commprof", run_name="__main__")
except SystemExit as exc:  # a rank that never joined a job ends the usual way
    _report_and_exit(0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1)
