"""A result file rewritten in place (write_atomic: a new file renamed over the old) keeps the mode the
existing file had."""

import os
import stat

from commprof.report.files import write_atomic


def test_an_existing_file_keeps_its_mode(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("{}")
    path.chmod(0o604)
    write_atomic(path, "[]\n")
    assert path.read_text() == "[]\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o604
