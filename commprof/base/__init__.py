"""The base layer: what a job is (world, job folder, errors), what every figure means (measurement, stats,
units), what each backend can run, the flags every job takes, atomic files, the env block, a start-up
deadline and a failing rank's last words. Imports nothing else of commprof; loads no torch at import."""
