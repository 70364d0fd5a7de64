"""Tests for the NVTX recorder (tests/support/nvtx_recorder.{c,py}).

These really compile the injection library with gcc and run Python
subprocesses that emit NVTX through the ``nvtx`` package, with the recorder
attached through NVTX_INJECTION64_PATH (the mechanism Nsight Systems uses).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

import nvtx_recorder  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc not available to build the NVTX recorder")

MSG = "all_reduce 1.0 KiB float32"


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    return nvtx_recorder.build(tmp_path_factory.mktemp("nvtx_recorder_lib"))


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NVTX_INJECTION64_PATH", "COMMPROF_NVTX_RECORD", "NVTX_DISABLE")}
    return env


def _run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


NVTX_SCRIPT = f"""
    import nvtx
    d = nvtx.get_domain("commprof")
    assert type(d).__name__ == "Domain", type(d)   # not the no-op DummyDomain
    attrs = d.get_event_attributes(message={MSG!r}, category="comm")
    d.push_range(attrs)
    nvtx.push_range("x", domain="commprof", category="compute")
    nvtx.pop_range(domain="commprof")
    d.pop_range()
    d.push_range(attrs)          # reused attributes: same registered string + category
    d.pop_range()
    nvtx.push_range("plain")     # default domain, no category
    nvtx.pop_range()
"""


def test_build_produces_shared_library(lib):
    assert lib.is_file() and lib.name == nvtx_recorder.LIB_NAME
    assert (nvtx_recorder.find_include_dir() / "nvtx3" / "nvToolsExt.h").is_file()


def test_nvtx_package_ranges_are_recorded(lib, tmp_path):
    prefix = tmp_path / "rec"
    proc = _run_python(NVTX_SCRIPT + "\n    import os; print(os.getpid())",
                       nvtx_recorder.recorder_env(lib, prefix, _clean_env()))
    pid = int(proc.stdout.split()[-1])
    assert [p.name for p in nvtx_recorder.record_files(prefix)] == [f"rec.{pid}"]

    recs = nvtx_recorder.read_records(prefix)
    got = [(r["kind"], r["domain"], r["category"], r["message"], r["depth"]) for r in recs]
    assert got == [
        ("push", "commprof", "comm", MSG, 0),
        ("push", "commprof", "compute", "x", 1),
        ("pop", "commprof", "", "", 1),
        ("pop", "commprof", "", "", 0),
        ("push", "commprof", "comm", MSG, 0),
        ("pop", "commprof", "", "", 0),
        ("push", "", "", "plain", 0),
        ("pop", "", "", "", 0),
    ]
    assert {r["pid"] for r in recs} == {pid}
    assert len({r["tid"] for r in recs}) == 1
    assert nvtx_recorder.unbalanced(recs) == {}
    assert nvtx_recorder.summarize(recs) == {
        ("commprof", "comm", MSG): 2, ("commprof", "compute", "x"): 1, ("", "", "plain"): 1}


def test_unbalanced_pop_and_marks(lib, tmp_path):
    prefix = tmp_path / "rec"
    _run_python("""
        import nvtx
        nvtx.mark("here", domain="commprof", category="comm")
        nvtx.pop_range(domain="commprof")          # pop without push
        nvtx.push_range("open", domain="commprof")  # never popped
    """, nvtx_recorder.recorder_env(lib, prefix, _clean_env()))
    recs = nvtx_recorder.read_records(prefix)
    assert [(r["kind"], r["category"], r["message"], r["depth"]) for r in recs] == [
        ("mark", "comm", "here", 0), ("pop", "", "", -1), ("push", "", "open", 0)]
    ((key, n),) = nvtx_recorder.unbalanced(recs).items()
    assert key[2] == "commprof" and n == 0      # net zero, but flagged by the -1 pop


def test_per_process_files_survive_os_exit(lib, tmp_path):
    prefix = tmp_path / "rec"
    _run_python("""
        import os, nvtx
        d = nvtx.get_domain("commprof")
        d.push_range(message="parent", category="comm")
        pid = os.fork()
        if pid == 0:                       # child: inherits the attached recorder
            d.push_range(message="child", category="comm")
            d.pop_range()
            os._exit(0)                    # no atexit / buffer flushing
        os.waitpid(pid, 0)
        d.pop_range()
        os._exit(0)
    """, nvtx_recorder.recorder_env(lib, prefix, _clean_env()))
    files = nvtx_recorder.record_files(prefix)
    assert len(files) == 2
    recs = nvtx_recorder.read_records(prefix)
    by_pid = {}
    for r in recs:
        by_pid.setdefault(r["pid"], []).append((r["kind"], r["message"]))
    assert sorted(by_pid.values()) == [[("push", "child"), ("pop", "")],
                                       [("push", "parent"), ("pop", "")]]
    assert nvtx_recorder.unbalanced(recs) == {}


def test_no_record_without_injection(lib, tmp_path):
    prefix = tmp_path / "rec"
    env = _clean_env()
    env["COMMPROF_NVTX_RECORD"] = str(prefix)       # recorder target set, but not injected
    _run_python(NVTX_SCRIPT.replace('assert type(d).__name__ == "Domain", type(d)', "pass"),
                env)
    assert nvtx_recorder.record_files(prefix) == []
    assert list(tmp_path.iterdir()) == []
    assert nvtx_recorder.read_records(prefix) == []


def test_injected_without_record_env_declines(lib, tmp_path):
    env = _clean_env()
    env["NVTX_INJECTION64_PATH"] = str(lib)
    _run_python(NVTX_SCRIPT.replace('assert type(d).__name__ == "Domain", type(d)', "pass"),
                env)
    assert list(tmp_path.iterdir()) == []


def test_c_core_api(lib, tmp_path):
    """Non-domain API (CORE module) from C: NameCategory, PushA/PushEx, MarkA, Pop."""
    src = tmp_path / "app.c"
    src.write_text(textwrap.dedent("""
        #include <nvtx3/nvToolsExt.h>
        int main(void) {
            nvtxNameCategoryA(3, "io");
            nvtxRangePushA("outer");
            nvtxEventAttributes_t a = {0};
            a.version = NVTX_VERSION; a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
            a.category = 3; a.messageType = NVTX_MESSAGE_TYPE_ASCII; a.message.ascii = "inner";
            nvtxRangePushEx(&a);
            a.category = 9; a.message.ascii = "tab\\there";
            nvtxMarkEx(&a);
            nvtxRangePop();
            nvtxRangePop();
            return 0;
        }
    """))
    exe = tmp_path / "app"
    subprocess.run(["gcc", f"-I{nvtx_recorder.find_include_dir()}", "-o", str(exe), str(src),
                    "-ldl"], check=True)
    prefix = tmp_path / "rec"
    subprocess.run([str(exe)], env=nvtx_recorder.recorder_env(lib, prefix, _clean_env()),
                   check=True)
    recs = nvtx_recorder.read_records(prefix)
    assert [(r["kind"], r["domain"], r["category"], r["message"], r["depth"]) for r in recs] == [
        ("push", "", "", "outer", 0),
        ("push", "", "io", "inner", 1),
        ("mark", "", "9", "tab here", 2),
        ("pop", "", "", "", 1),
        ("pop", "", "", "", 0),
    ]


def test_cli_summary(lib, tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "nvtx_recorder.py"), "--out", str(out), "--",
         sys.executable, "-c", textwrap.dedent(NVTX_SCRIPT)],
        env=_clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "4 ranges" in proc.stdout
    assert f"commprof         comm             {MSG}" in proc.stdout
    assert "WARNING" not in proc.stdout
    assert len(nvtx_recorder.record_files(out)) == 1


def test_start_end_ranges_across_threads(lib, tmp_path):
    """A start/end range (NVTX's process range) ended on another thread than the one that started it, with
    its domain, category, message, colour and payload, paired with its end by range id."""
    prefix = tmp_path / "rec"
    _run_python(f"""
        import threading, time, nvtx
        d = nvtx.get_domain("commprof comm (world)")
        attrs = d.get_event_attributes(message={MSG!r}, color=0xFFF44336, category="comm", payload=1024)
        first = d.start_range(attrs)
        second = d.start_range(attrs)
        d.end_range(second)                  # ended before the first: start/end ranges need not nest
        time.sleep(0.02)
        ender = threading.Thread(target=d.end_range, args=(first,))
        ender.start(); ender.join()
        d.start_range(attrs)                 # never ended
    """, nvtx_recorder.recorder_env(lib, prefix, _clean_env()))
    recs = nvtx_recorder.read_records(prefix)
    assert [r["kind"] for r in recs] == ["start", "start", "end", "end", "start"]
    first, second, unended = nvtx_recorder.start_end_ranges(recs)
    for r in (first, second, unended):
        assert (r["domain"], r["category"], r["message"]) == ("commprof comm (world)", "comm", MSG)
        assert (r["color"], r["payload"], r["depth"]) == (0xFFF44336, 1024, None)
    assert len({first["range_id"], second["range_id"], unended["range_id"]}) == 3
    assert first["end_tid"] != first["tid"] and second["end_tid"] == second["tid"]  # ended on the other thread
    assert first["dur_ns"] >= 20_000_000 > second["dur_ns"] >= 0
    assert unended["end_tid"] is None and unended["dur_ns"] is None
    assert nvtx_recorder.unbalanced(recs) == {}  # push/pop balance says nothing of start/end ranges
    assert nvtx_recorder.summarize(recs) == {("commprof comm (world)", "comm", MSG): 3}
