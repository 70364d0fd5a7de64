"""A local MPI job's own network: mpiexec and its ranks in a network namespace that holds loopback alone.

Hydra, MPICH's mpiexec, listens for its proxies and ranks (the PMI control port) on every interface, and
has no setting for the address it binds; its ranks inherit the socket. A local job needs no network but
loopback, so the launcher starts mpiexec through this module: it leaves the host's network namespace for a
new one whose only interface is `lo`, brings `lo` up, and execs mpiexec. A listener on 0.0.0.0 there is
reachable from the job's own processes only. It needs CAP_SYS_ADMIN (root) or unprivileged user namespaces
(a user namespace is made first, the caller's uid and gid mapped to themselves); where the kernel refuses
both, mpiexec runs in the host's namespace, as it would without commprof (docs/failures.md). `-iface lo`
works in either.

    python -m commprof.launcher.netns mpiexec -iface lo -n 2 …

Exercised by: `pytest tests/test_signals.py -k loopback`.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ = "16sH22x"
"""struct ifreq as SIOC[GS]IFFLAGS read it: the interface's name, its flags, the rest of the union."""


def enter(user_namespace: bool | None = None) -> bool:
    """Move this process into a new network namespace with `lo` up; False (and nothing changed) where the
    kernel refuses. `user_namespace`: make a user namespace first, as a user without root must (None: only
    where a network namespace alone is refused)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if user_namespace or libc.unshare(CLONE_NEWNET) != 0:
        if user_namespace is False or libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            return False
        # without maps the process would be `nobody` inside; itself mapped to itself, it stays who it was
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    _up("lo")
    return True


def _up(name: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, name.encode(), 0))
        flags = struct.unpack(IFREQ, req)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, name.encode(), flags | IFF_UP))


def usable() -> bool:
    """Whether enter() works here, tried in a child: a kernel may allow a user namespace and then refuse what
    is done in it (Ubuntu's AppArmor), and a process cannot leave a namespace it entered."""
    pid = os.fork()
    if pid == 0:
        try:
            ok = enter()
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    return os.waitpid(pid, 0)[1] == 0


def main(argv: list[str]) -> None:
    """Exec `argv` (mpiexec's command line) in a loopback-only namespace, or in the host's when none can be
    made. Give Hydra `-iface lo`: its proxies connect to the address it names, and the host's name may
    resolve to one that is not in here."""
    if usable():
        enter()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
