"""A result file rewritten in place (write_atomic: a new file renamed over the old) keeps the mode the
existing file had."""

import os
import stat

from commprof.base.files import write_atomic


def test_an_existing_file_keeps_its_mode(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("{}")
    path.chmod(0o604)
    write_atomic(path, "[]\n")
    assert path.read_text() == "[]\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o604


def test_a_temp_file_left_by_a_killed_writer_goes_with_the_next_write(tmp_path):
    # a writer killed between its write and its rename leaves `.r.json.<pid>.<random>.tmp`, 0 bytes
    gone = int(open("/proc/sys/kernel/pid_max").read()) + 1  # never a live process
    stale = tmp_path / f".r.json.{gone}.abc123.tmp"
    alive = tmp_path / f".r.json.{os.getppid()}.def456.tmp"  # another writer, still going
    other = tmp_path / f".s.json.{gone}.abc123.tmp"  # another file's
    for f in (stale, alive, other):
        f.write_text("")
    write_atomic(tmp_path / "r.json", "{}\n")
    assert not stale.exists() and alive.exists() and other.exists()
    assert (tmp_path / "r.json").read_text() == "{}\n"
