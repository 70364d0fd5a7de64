"""Importing commprof's plots loads no matplotlib (a process of its own: this one has it loaded). The plots
themselves are drawn from recorded bench and run JSON in tests/unit/test_plots_recorded.py."""

import subprocess
import sys

from spawn import env_for_tests


def test_importing_plots_leaves_matplotlib_unloaded():
    code = "import sys, commprof.report.plots; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    proc = subprocess.run([sys.executable, "-c", code], env=env_for_tests(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
