"""Hosts of our own (tools/hosts: network namespaces on one bridge, each link rate-shaped) and commprof
across them under each launcher: torchrun with c10d rendezvous, mpiexec whose hydra starts its proxies
through the fabric, and srun's variables set by hand. What the profiler measures is held to the link's
rate. Skips, with the reason, where this is not root or `ip`, `tc` or `unshare` is missing."""

import json
import os
import shutil
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from spawn import _run, env_for_tests

from commprof.perfmodel.alphabeta import fit

ROOT = Path(__file__).resolve().parents[1]
FABRIC = str(ROOT / "tools" / "hosts")
RATE, RATE_GBPS = "200mbit", 0.025
NAME = f"t{os.getpid()}"
"""This run's fabric (COMMPROF_FABRIC): another checkout's tests, or its benchmarks, may have theirs up."""
HOSTS = (f"{NAME}-h0", f"{NAME}-h1")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "unshare")),
    reason="tools/hosts needs root, ip, tc and unshare")


def fabric(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([FABRIC, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COMMPROF_FABRIC=NAME))
    assert not check or proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def hosts():
    fabric("up", str(len(HOSTS)), "--rate", RATE)
    try:
        yield [tuple(line.split()) for line in fabric("hosts").stdout.splitlines()]
    finally:
        fabric("down")


def on_hosts(commands: list[tuple[str, list[str], dict]], timeout: float = 180) -> subprocess.CompletedProcess:
    """Each (host, argv, extra env) started at once inside its host; the worst exit code."""
    return _run([([FABRIC, "exec", host, "--", *argv], env_for_tests(COMMPROF_FABRIC=NAME, **extra))
                 for host, argv, extra in commands], timeout)


def bench_json(proc: subprocess.CompletedProcess, path: Path) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(path.read_text())


# The control: what the link delivers now to the exchange bench's sendrecv times (each end sends and
# receives the same bytes at once), over plain sockets, between the same namespaces and beside whatever
# else this machine is running. commprof's figures are held to it, measured just before and just after
# them, rather than to the rate tc was given: what TCP gets of that rate depends on the headers, the
# kernel and what else wants the cores and the link right then, and the control meets the same. A fixed
# band around the rate failed on a busy machine (a fit at 0.90 of the rate, load ~5 on 2 cores); TOL is
# for what the two programs' own costs differ by.
CONTROL = r"""
import json, socket, sys, threading, time
peer, port, size, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if peer == "-":
    with socket.create_server(("", port)) as srv:
        srv.settimeout(60)
        s, _ = srv.accept()
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            s = socket.create_connection((peer, port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
s.settimeout(60)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def recv(n):
    buf, got = memoryview(bytearray(n)), 0
    while got < n:
        k = s.recv_into(buf[got:])
        if not k:
            raise EOFError("the other end went away")
        got += k
data, times = bytes(size), []
for i in range(iters + 1):  # the first warms the connection up (TCP's window), as bench's warmup does
    s.sendall(b"x")  # both ends start together, as after bench's barrier
    recv(1)
    t0 = time.perf_counter()
    sender = threading.Thread(target=s.sendall, args=(data,))
    sender.start()
    recv(size)
    sender.join()
    times.append(time.perf_counter() - t0)
print(json.dumps(times[1:]))
"""
CONTROL_BYTES = 4 << 20
CONTROL_PORT = 29420
TOL = 0.2
"""How far a figure of commprof's may sit from the control's: both are TCP over the same link, but
through different software (gloo or MPI against Python's sockets), which a loaded machine slows unalike.
A byte count or a clock off by 2x is well outside."""
CEILING = 1.05 * RATE_GBPS
"""No payload gets through faster than tbf's rate (TCP/IP's headers take ~4% of it); the margin above
is a 4 MiB op's share of tbf's 64 KiB burst, and each rank timing from its own start: the later one
finds some of its peer's bytes already there."""


def link_GBps(iters: int = 5) -> float:
    """The link's bandwidth each way between the hosts, both ways at once, over plain TCP sockets: the
    bytes over the median exchange of both ends. One size, the largest bench sends, whose time the
    per-exchange cost and tbf's burst change by ~2%."""
    argv = [sys.executable, "-c", CONTROL]
    args = [str(CONTROL_PORT), str(CONTROL_BYTES), str(iters)]
    proc = on_hosts([(HOSTS[0], [*argv, "-", *args], {}), (HOSTS[1], [*argv, HOSTS[0], *args], {})], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ends = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(ends) == 2, proc.stdout
    return CONTROL_BYTES / statistics.median(t for end in ends for t in end) / 1e9


@contextmanager
def control() -> Iterator[list[float]]:
    """The link measured before and after the body; what is yielded holds both once the body is done."""
    seen = [link_GBps()]
    yield seen
    seen.append(link_GBps())


def held_to(value: float, seen: list[float], scale: float = 1.0) -> bool:
    """`value` within TOL of the control's range (times `scale`)."""
    return min(seen) * scale * (1 - TOL) <= value <= max(seen) * scale * (1 + TOL)


def check_bench(doc: dict, seen: list[float], ranks_per_host: int = 1) -> None:
    env = doc["env"]
    assert env["hosts"] == list(HOSTS) and env["ranks_per_host"] == ranks_per_host
    assert env["world_size"] == len(HOSTS) * ranks_per_host and not env["oversubscribed"]
    big = [r for r in doc["results"] if r["nbytes"] == 4 << 20 and r["algo"] == "library"]
    assert big and all(r["wrong"] == 0 for r in doc["results"])
    # 2 ranks, one per host: each sends S per all_reduce (and per sendrecv) over its link, both ways at
    # once, as the control does. The fastest iteration is the link's: MPI over TCP on two shared cores
    # now and then takes 30-65 ms more for one 180 ms op, in runs of several, which no link explains
    best = [r["bus_factor"] * r["nbytes"] / (r["min_us"] * 1e3) for r in big]
    # the sendrecv sweep (run first for --algo) gives the algorithms' rows one α–β fit …
    fits = {json.dumps(r["alpha_beta"], sort_keys=True) for r in doc["results"] if r.get("alpha_beta")}
    assert len(fits) == 1, fits
    # … and the same fit of each size's median iteration recovers what the link delivered. Not the mean
    # over iterations, which bench fits: one of those slow MPI runs moves it (it once gave 0.88 of the
    # rate); not the fastest iteration either: at 64 KiB, one that starts with tbf's bucket full passes at
    # memory speed. Only from 1 MiB up, where the link's 40 ms and more per op outweigh what a busy machine
    # adds to each (the ms it waits for a core, several times a 64 KiB op's own): with the small sizes in,
    # those ms set the line's α and so its slope, which under load ~9 came out anywhere in 0.92-1.22 of
    # the control's figure
    p2p = [(r["nbytes"], r["p50_us"] * 1e-6) for r in doc["results"]
           if r["collective"] == "sendrecv" and r["nbytes"] >= 1 << 20]
    median = fit(p2p).as_record()
    print(f"control {[round(c, 5) for c in seen]} GB/s, fit {median['bandwidth_GBps']:.5f}, "
          f"fastest 4 MiB {[round(b, 5) for b in best]}")
    assert held_to(median["bandwidth_GBps"], seen), (median, seen)
    # the fitted slope is not held to the ceiling: it is no transfer, and one slow median bends it either
    # way. The fastest op is one, and no slower than the control's median one
    assert all(min(seen) * (1 - TOL) <= b <= CEILING for b in best), (best, seen)


BENCH = ["-m", "commprof", "bench", "all_reduce", "--algo", "library,ring", "-b", "64K", "-e", "4M", "-f", "4",
         "-n", "5", "-w", "1"]


def test_hosts_have_names_addresses_and_no_way_out(hosts):
    assert hosts == [(HOSTS[0], "10.231.7.1"), (HOSTS[1], "10.231.7.2")]
    out = fabric("exec", HOSTS[1], "--", "sh", "-c", f"hostname; getent hosts {HOSTS[0]}; ip route").stdout
    out = out.splitlines()
    assert out[0] == HOSTS[1] and out[1].split() == ["10.231.7.1", HOSTS[0]]
    assert out[2:] == [r for r in out[2:] if r.startswith("10.231.7.0/24")] and out[2:], out  # no default route
    assert NAME not in subprocess.run(["hostname"], capture_output=True, text=True).stdout  # ours untouched


def torchrun(nproc_per_host: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(HOSTS)), "--nproc-per-node",
            str(nproc_per_host), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOSTS[0]}:{port}", "--rdzv-id", "t"]


def test_bench_across_hosts_under_torchrun_with_a_trace(hosts, tmp_path):
    out = tmp_path / "b.json"
    with control() as seen:
        proc = on_hosts([(h, [*torchrun(1, 29411), *BENCH, "--backend", "gloo", "--json", str(out),
                              "--trace", str(tmp_path / "trace")], {}) for h in HOSTS])
    doc = bench_json(proc, out)
    check_bench(doc, seen)
    assert doc["env"]["launcher"] == "torchrun"
    # the hosts share one clock: the offset measured for the other host is ~0, within its bound
    clocks = json.loads((tmp_path / "trace" / "trace.json").read_text())["otherData"]["clock_sync"]
    other = next(r for r in clocks["ranks"] if r["host"] == HOSTS[1])
    assert abs(other["measured_offset_ns"]) <= other["bound_ns"], other
    assert other["applied_offset_ns"] == other["measured_offset_ns"]  # another host: its offset is applied


def test_bench_across_hosts_under_mpiexec(hosts, tmp_path):
    from commprof.launcher.launch import find_mpiexec

    out = tmp_path / "b.json"
    argv = [find_mpiexec(), "-launcher", "rsh", "-launcher-exec", FABRIC, "-hosts", ",".join(HOSTS), "-n", "2",
            "-ppn", "1", sys.executable, *BENCH, "--backend", "mpi", "--json", str(out)]
    with control() as seen:
        proc = on_hosts([(HOSTS[0], argv, {})])
    doc = bench_json(proc, out)
    check_bench(doc, seen)
    assert doc["env"]["launcher"] == "mpiexec"


def test_bench_across_hosts_with_srun_variables(hosts, tmp_path):
    out = tmp_path / "b.json"
    slurm = {"SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1",
             "SLURM_JOB_NODELIST": f"{NAME}-h[0-1]", "SLURM_JOB_ID": "4242"}
    with control() as seen:
        proc = on_hosts([(h, [sys.executable, *BENCH, "--backend", "gloo", "--json", str(out)],
                          {**slurm, "SLURM_PROCID": str(i)}) for i, h in enumerate(HOSTS)])
    doc = bench_json(proc, out)
    check_bench(doc, seen)
    assert doc["env"]["launcher"] == "srun"


# collectives (ddp) and messages (a pipeline's) across the hosts; fsdp's traffic against its prediction is the
# same on one host (tests/test_strategies.py)
@pytest.mark.parametrize("strategy", ["ddp", "pipeline-1f1b"])
def test_run_across_two_hosts_of_two_ranks(hosts, tmp_path, strategy):
    out = tmp_path / "r.json"
    argv = [*torchrun(2, 29412), "-m", "commprof", "run", "--strategy", strategy, "--model", "mnist-cnn",
            "--steps", "3", "--warmup", "1", "--batch-size", "8", "--eval-samples", "0", "--json", str(out)]
    proc = on_hosts([(h, argv, {}) for h in HOSTS])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["env"]["hosts"] == list(HOSTS) and doc["env"]["ranks_per_host"] == 2
    assert doc["env"]["world_size"] == 4 and not doc["env"]["oversubscribed"]
    for op, v in doc["volume"].items():
        assert v["payload_bytes_per_step"] == v["predicted_payload_bytes_per_step"], op


def test_intra_and_inter_host_levels_measured_apart(hosts, tmp_path):
    out = tmp_path / "b.json"
    argv = [*torchrun(2, 29413), "-m", "commprof", "bench", "all_reduce", "--groups", "intra,inter", "-b", "4M",
            "-e", "4M", "-n", "6", "-w", "1", "--backend", "gloo", "--json", str(out)]
    with control() as seen:
        proc = on_hosts([(h, argv, {}) for h in HOSTS])
    doc = bench_json(proc, out)
    by_level = {r["level"]: r for r in doc["results"] if r["inplace"]}
    intra, inter = by_level["intra"], by_level["inter"]
    assert (intra["group_size"], intra["groups"], inter["group_size"], inter["groups"]) == (2, 2, 2, 2)
    assert all(r["wrong"] == 0 for r in doc["results"])
    # two pairs cross the hosts at once, both through each host's one link: the pair that ends last has
    # waited for both pairs' bytes (half of what the link delivers each, however TCP shared it on the
    # way); within a host nothing is shaped. Two rings through one tbf now and then leave the link idle
    # for a while after a burst of drops (no timeout: fast retransmits, 10-80 of them per run): over 3
    # iterations that once cost 21 % of the mean, over 6 the lowest of 10 runs was 0.94 of the control
    print(f"control {[round(c, 5) for c in seen]} GB/s, inter {inter['group_busbw_GBps']}, "
          f"intra {intra['group_busbw_GBps']}")
    assert held_to(min(inter["group_busbw_GBps"]), seen, scale=0.5), (inter, seen)
    assert max(inter["group_busbw_GBps"]) <= CEILING, inter
    assert min(intra["group_busbw_GBps"]) > 4 * max(seen), (intra, seen)


def test_link_names_the_ops_below_half_of_a_link_they_do_not_get(hosts, tmp_path):
    # DDP across the 200 Mbit/s link, one bucket of 2.9 MB a step (SqueezeNet: tc's 64 KiB burst, which passes
    # at memory speed, is 2 % of it). Told the link is ten times faster than what tc gives, the findings name
    # that all_reduce at about a tenth of it; held to the link it crosses, nothing.
    from commprof.findings.kinds import LINK_SHARE, find
    from commprof.perfmodel.fabric import link_flag
    from commprof.perfmodel.timeline import load

    out, trace = tmp_path / "r.json", tmp_path / "t"
    claimed = 10 * RATE_GBPS
    argv = [*torchrun(1, 29414), "-m", "commprof", "run", "--strategy", "ddp", "--model", "squeezenet1_0",
            "--steps", "5", "--warmup", "2", "--batch-size", "4", "--bucket-mb", "100", "--eval-samples", "0",
            "--trace", str(trace), "--json", str(out), "--link-rate", f"{claimed * 8:g}Gbit/s"]
    proc = on_hosts([(h, argv, {}) for h in HOSTS])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    block = json.loads(out.read_text())["findings"]
    found = reported = [f for f in block["items"] if f["kind"] == "link"]
    if not found:
        # the link's cost stays what tc makes it while a busy machine stretches the compute: its share of the
        # step can fall under the threshold (4.6 % seen beside two busy loops); the findings then say the host
        # was contended, and the finding is there below the threshold
        assert block.get("contended"), block
        found = [f for f in find(load(str(trace)), threshold=0.0, link=link_flag(f"{claimed}GB/s"))
                 if f["kind"] == "link"]
    assert len(found) == 1 and found[0]["op"] == "all_reduce", found
    ops = found[0]["evidence"]["ops"]
    print(f"link: {found[0]['ms_per_step']:.2f} ms/step, step without {found[0]['step_ms_without']:.2f} ms; "
          + ", ".join(f"{o['op']} {o['bytes']} B at {o['fraction_of_link']:.3f} of the link" for o in ops))
    assert all(o["fraction_of_link"] < LINK_SHARE for o in ops) and 0.05 <= ops[0]["fraction_of_link"] <= 0.11, ops
    assert not reported or ("link" in proc.stdout and f"of the {claimed:.3g} GB/s link" in proc.stdout)
    assert not [f for f in find(load(str(trace)), link=link_flag(f"{RATE_GBPS}GB/s")) if f["kind"] == "link"]
    # given as levels, the hosts' link is the inter level: a fast intra level changes nothing, a slow one too
    assert not [f for f in find(load(str(trace)), link=link_flag(f"intra=1GB/s,1us;inter={RATE_GBPS}GB/s,1us"))
                if f["kind"] == "link"]
    (again,) = [f for f in find(load(str(trace)), link=link_flag(f"intra={RATE_GBPS}GB/s,1us;inter={claimed}GB/s,1us"))
                if f["kind"] == "link"]
    assert again["evidence"]["ops"][0]["fraction_of_link"] == pytest.approx(ops[0]["fraction_of_link"], rel=0.01)


def test_link_names_the_ops_a_slowed_host_holds_below_half_of_the_link(hosts, tmp_path):
    # The same job held to the link's true rate (nothing at that rate: the test above), with host 1's link
    # slowed to an eighth of it: the findings name the all_reduce at about an eighth of the link.
    out = tmp_path / "r.json"
    argv = [*torchrun(1, 29416), "-m", "commprof", "run", "--strategy", "ddp", "--model", "squeezenet1_0",
            "--steps", "4", "--warmup", "1", "--batch-size", "4", "--bucket-mb", "100", "--eval-samples", "0",
            "--json", str(out), "--link-rate", f"{RATE_GBPS * 8:g}Gbit/s"]
    fabric("rate", HOSTS[1], f"{tc_bits(RATE) // 8}bit")
    try:
        proc = on_hosts([(h, argv, {}) for h in HOSTS])
    finally:
        fabric("rate", HOSTS[1], RATE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = [f for f in json.loads(out.read_text())["findings"]["items"] if f["kind"] == "link"]
    assert len(found) == 1 and found[0]["op"] == "all_reduce", found
    fraction = found[0]["evidence"]["ops"][0]["fraction_of_link"]
    print(f"slowed host: all_reduce at {fraction:.3f} of the link, {found[0]['ms_per_step']:.1f} ms/step")
    assert 0.06 <= fraction <= 0.14, found  # an eighth, less TCP/IP's headers


def tc_bits(rate: str) -> int:
    return int(float(rate.removesuffix("mbit")) * 1e6)


@pytest.mark.parametrize("args, words", [  # {NAME} stands for this process's fabric (ids the same in every worker)
    (("up", "0"), "up 0: give 1 to 200 hosts"),
    (("up", "2", "--rate", "fast"), "--rate 'fast': give tc units"),
    (("exec", "{NAME}-h9", "--", "true"), "no host '{NAME}-h9'"),
    (("exec", "{NAME}-h0"), "give a command"),
    (("rate", "{NAME}-h9", "25mbit"), "no host '{NAME}-h9'"),
    (("rate", "{NAME}-h0", "slow"), "--rate 'slow': give tc units"),
])
def test_bad_input_is_one_line_exit_2(hosts, args, words):
    args, words = [a.replace("{NAME}", NAME) for a in args], words.replace("{NAME}", NAME)
    proc = fabric(*args, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("hosts: error: ") and words in proc.stderr, proc.stderr


def test_without_root_it_says_so(tmp_path):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is missing")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, FABRIC,
                           "hosts"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "hosts: error: hosts needs root (network namespaces, veth " \
        "links, tc)\n", proc.stderr


def test_pinned_hosts_run_on_cores_of_their_own(hosts):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < len(HOSTS):
        pytest.skip(f"--pin needs a core per host: {len(cores)} core(s)")
    try:
        fabric("up", str(len(HOSTS)), "--rate", RATE, "--pin")
        seen = [fabric("exec", h, "--", "sh", "-c", "taskset -pc $$").stdout.split(":")[-1].strip() for h in HOSTS]
        share = len(cores) // len(HOSTS)
        assert seen == [",".join(map(str, cores[i * share:(i + 1) * share])) for i in range(len(HOSTS))], seen
        proc = fabric("up", str(len(cores) + 1), "--pin", check=False)
        assert proc.returncode == 2 and f"--pin gives each host cores of its own: {len(cores) + 1} hosts" in proc.stderr
    finally:
        fabric("up", str(len(HOSTS)), "--rate", RATE)  # the module's hosts as they were


def test_two_fabrics_keep_their_own_hosts(hosts):
    """Another fabric up and down beside this one (another checkout's tests, a benchmark) leaves ours be."""
    other = dict(os.environ, COMMPROF_FABRIC=f"{NAME}x")

    def theirs(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([FABRIC, *args], capture_output=True, text=True, timeout=120, env=other)

    try:
        assert theirs("up", "1").returncode == 0
        assert theirs("hosts").stdout.split() == [f"{NAME}x-h0", "10.231.7.1"]
        assert [tuple(line.split()) for line in fabric("hosts").stdout.splitlines()] == hosts
    finally:
        assert theirs("down").returncode == 0
    assert theirs("hosts").stdout == ""
    assert fabric("exec", HOSTS[1], "--", "hostname").stdout.strip() == HOSTS[1]  # ours still up
    bad = subprocess.run([FABRIC, "hosts"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, COMMPROF_FABRIC="a b"))
    assert bad.returncode == 2 and bad.stderr == "hosts: error: COMMPROF_FABRIC='a b': give 1 to 12 letters " \
        "or digits\n", bad.stderr
