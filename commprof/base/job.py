"""The job folder: what the ranks of one `commprof --nproc N` launch share besides the network.

The launcher makes a private folder (`make`) and names it in COMMPROF_JOB_DIR. In it:
  launcher.pid    the launcher's pid: the launcher removes the folder at its end, and a launcher that could not
                  (killed by SIGKILL) leaves it to the next one, which removes every folder whose launcher is gone
  rank<r>.pid     each rank's pid, written when it starts (the launcher stops every one of them at the end,
                  even one that mpiexec lost track of, e.g. a stopped process)
  exit<r>         rank r is ending through commprof (its exit code): a rank that ends with a code and left
                  none ended outside it — os._exit in the script, a library that exited — and the launcher
                  names it with its own code
  failure.json    the job's failure — exit code, one line, who saw it — created once, by whoever saw a
                  failure first (a rank, or the launcher when a rank was killed by a signal): the job exits
                  with that code whatever mpiexec makes of its ranks' ends, and only that one line is said
Ranks check in here before they touch the network: MPI_Init and a torch rendezvous hold the interpreter,
so a peer that stops during start-up can only be seen before them.

Without the folder (torchrun, srun, a bare mpiexec) every function here is a no-op that lets a rank
speak for itself. Under torchrun a failing rank also writes torchrun's own error file (`tell_torchrun`), so
its summary names the rank that failed first. Exercised by:
`pytest tests/unit/test_failure_diagnosis.py tests/test_failures.py`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from commprof.base.errors import PeerTimeoutError

ENV = "COMMPROF_JOB_DIR"
FAILURE = "failure.json"
LAUNCHER = "launcher.pid"
PREFIX = "commprof-job-"
LAUNCHER_FIRST_S = 0.5
"""How long a rank that lost a peer waits before it claims the job's failure: commprof's launcher, which sees
how the peer ended (a signal, a stop), names it better than the rank can."""


def make() -> Path:
    """A new job folder in the temp dir, after removing the folders of launchers that are gone."""
    for stale in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            os.kill(int((stale / LAUNCHER).read_text()), 0)
        except ProcessLookupError:  # its launcher is gone
            shutil.rmtree(stale, ignore_errors=True)
        except (OSError, ValueError):  # not ours, being made, or from before launchers wrote their pid
            continue
    made = Path(tempfile.mkdtemp(prefix=PREFIX))
    (made / LAUNCHER).write_text(f"{os.getpid()}\n")
    return made


def folder() -> Path | None:
    """This job's folder, or None when no commprof launcher made one."""
    path = os.environ.get(ENV)
    return Path(path) if path else None


def claim(code: int, message: str, rank: int | None, where: Path | None = None) -> bool:
    """Record the job's failure; True when this is the first one (its finder says it), False otherwise.
    `where`: the job folder (the launcher's own; ranks find theirs in the environment)."""
    where = where or folder()
    if where is None:
        return True
    try:
        fd = os.open(where / FAILURE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except OSError:  # the folder went away: the launcher is gone, speak for ourselves
        return True
    with os.fdopen(fd, "w") as f:
        json.dump({"code": code, "message": message, "rank": rank}, f)
    return True


def tell_torchrun(message: str, *, first: bool) -> None:
    """The failure in torchrun's error file (TORCHELASTIC_ERROR_FILE; nothing without one). torchrun names as
    `Root Cause` the failure with the smallest timestamp — whole seconds, a tie going to the lowest rank —
    so the rank that failed `first` rounds its time down and a rank that only answered it (later, by
    cause) rounds up. The one line, not the traceback: the rank has shown that once already."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time()
    stamp = math.floor(now) if first else math.ceil(now)
    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": message, "extraInfo": {"py_callstack": message,
                                                                       "timestamp": str(stamp)}}}, f)
    except OSError:
        pass


def defer_to_launcher() -> None:
    """Before a rank claims a peer's failure: give commprof's launcher, if there is one, the first word."""
    if folder() is not None:
        time.sleep(LAUNCHER_FIRST_S)


def note_exit(code: int | None) -> None:
    """This rank ends through commprof with `code` (see `exited`); nothing outside a launcher's job."""
    where, rank = folder(), os.environ.get("RANK") or os.environ.get("PMI_RANK")
    if where is None or rank is None:
        return
    try:
        (where / f"exit{rank}").write_text(f"{code or 0}\n")
    except OSError:  # the launcher is gone with its folder
        pass


def exited(where: Path, rank: int) -> bool:
    """Whether rank `rank` noted its exit (note_exit)."""
    return (where / f"exit{rank}").exists()


def failure(where: Path) -> dict | None:
    """The failure recorded in `where`, or None (also while its writer has not finished writing it)."""
    try:
        return json.loads((where / FAILURE).read_text())
    except (OSError, ValueError):
        return None


def check_in(rank: int, world_size: int, *, timeout_s: float, poll_s: float = 0.02) -> None:
    """Leave this rank's pid and wait until every rank of the job has, at most `timeout_s` after arriving."""
    where = folder()
    if where is None:
        return
    mine = where / f"rank{rank}.pid"
    mine.write_text(str(os.getpid()))
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world_size) if not (where / f"rank{r}.pid").exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            who = ", ".join(map(str, missing))
            raise PeerTimeoutError(f"rank {rank}: rank {who} did not start within {timeout_s:g} s (--timeout) "
                                   "of this one: a peer rank stalled or died during start-up")
        time.sleep(poll_s)


SHARED_MEMORY = "/dev/shm/"
MPICH_SHARED_MEMORY = "/dev/shm/mpich_"
"""MPICH's intranode segments (mpich_shm_*, mpich_shar_tmp*): the only files a rank removes on its own (a script's
own are its business)."""


def note_shared_memory() -> None:
    """Leave, in the job folder, the shared-memory files this process maps (MPICH's intranode segment,
    /dev/shm/mpich_shm_*): a rank that dies or is killed leaves its segment behind (2 MiB each, never
    reclaimed), and the launcher removes what its own ranks mapped once they are gone (shared_memory)."""
    where = folder()
    if where is None:
        return
    try:
        with open("/proc/self/maps") as maps:
            mine = sorted({line.split()[-1] for line in maps if f" {SHARED_MEMORY}" in line})
    except OSError:
        return
    if mine:
        (where / f"shm.{os.getpid()}").write_text("\n".join(mine) + "\n")


def release_shared_memory() -> None:
    """A rank ending on a failure without a launcher's job folder (a bare mpiexec, srun): unlink_shared_memory,
    which nobody else would do (the launcher removes what its ranks noted, once every rank is gone)."""
    if folder() is None:
        unlink_shared_memory()


def unlink_shared_memory() -> None:
    """Unlink MPICH's intranode segments this process maps, once every rank of its host maps them: the name
    goes, the memory stays theirs until the last ends. A job killed whole (Hydra kills every rank once one
    dies) otherwise leaves 2 MiB a host in /dev/shm, never reclaimed."""
    for path in mpich_segments("self"):
        try:
            os.unlink(path)
        except OSError:  # a peer was first
            pass


def mpich_segments(pid: int | str) -> set[str]:
    """The MPICH intranode segments process `pid` ("self": this one) maps."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split()[-1] for line in maps if f" {MPICH_SHARED_MEMORY}" in line}
    except OSError:
        return set()


def note_segments_of_ranks(where: Path) -> None:
    """The launcher, once the job failed: note the MPICH segments its ranks still map (a rank stopped or killed
    inside MPI_Init noted none of its own), for removal once every rank is gone."""
    for pid in pids(where).values():
        found = mpich_segments(pid)
        if found:
            try:
                (where / f"shm.{pid}").write_text("\n".join(sorted(found)) + "\n")
            except OSError:
                pass


def shared_memory(where: Path) -> list[str]:
    """Every shared-memory file the job's ranks noted mapping."""
    out: set[str] = set()
    for path in where.glob("shm.*"):
        try:
            out.update(line for line in path.read_text().splitlines() if line.startswith(SHARED_MEMORY))
        except OSError:
            continue
    return sorted(out)


def pids(where: Path) -> dict[int, int]:
    """rank -> pid of every rank that checked in."""
    out = {}
    for path in where.glob("rank*.pid"):
        try:
            out[int(path.stem[4:])] = int(path.read_text())
        except ValueError:
            continue
    return out


def process_state(pid: int) -> str | None:
    """The state letter of process `pid` in /proc (R, S, D, T stopped, t traced, Z, …); None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None


def stopped_sibling(pid: int) -> tuple[int, str] | None:
    """(pid, rank) of a stopped rank beside `pid` — its launcher's other children (torchrun's agent's, a
    Hydra proxy's) — where no commprof launcher watches the ranks (it names a stopped one itself)."""
    ppid = parent_of(pid)
    if ppid is None or folder() is not None:
        return None
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid and parent_of(int(entry)) == ppid \
                and process_state(int(entry)) in ("T",):
            try:
                raw = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            env = dict(v.split(b"=", 1) for v in raw.split(b"\0") if b"=" in v)
            who = env.get(b"RANK") or env.get(b"PMI_RANK")
            if who is not None:
                return int(entry), who.decode()
    return None


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
