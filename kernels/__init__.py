"""commprof.kernels: hand-written collective algorithms (ring, tree, recursive doubling, …) built on
point-to-point send/recv through `commprof.comm`. Installed as the subpackage `commprof.kernels`.

Each algorithm module exposes the same few functions and is listed in ALGORITHMS.
"""

ALGORITHMS: dict = {}
"""Algorithm name -> module; empty until the first algorithm lands."""
