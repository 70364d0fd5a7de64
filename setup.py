"""Which packages the wheel holds, found rather than listed (pyproject.toml holds everything else): every
package under commprof/, and kernels/ installed as commprof.kernels, never as a top-level `kernels` (a PyPI
package of that name would clash). A folder added to either is shipped without a line here;
tools/wheel_modules.py checks a built wheel against the folders."""

from setuptools import find_packages, setup

KERNELS = [f"commprof.{name}" for name in find_packages(include=["kernels", "kernels.*"])]

setup(packages=find_packages(include=["commprof", "commprof.*"]) + KERNELS,
      package_dir={"commprof.kernels": "kernels"})
