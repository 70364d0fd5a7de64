"""The command line: its parser (commands), its entry and one-line failures (main), grids of whole jobs
(sweep) and Nsight Systems around a job (nsys). `commprof --help` exercises it."""
