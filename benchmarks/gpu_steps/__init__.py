"""The steps of benchmarks/gpu_checks.py, a module each (tests, truth, hta, straggler, cost, idioms, nsys), every one
with `run(args, out, budget)`; harness.py holds what they share, summary.py the session's environment and
headline. Not benchmarks themselves: `OUT=out python3 benchmarks/gpu_checks.py STEP` runs one."""
