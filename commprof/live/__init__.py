"""Live: a long job's communication health while it runs (`--live`): windows of steps folded on each rank
(window.py), combined on rank 0 with their findings (combine.py), served to Prometheus and appended to a JSON
Lines log (export.py), wired into a job by monitor.py; the flags in config.py. docs/live.md."""
