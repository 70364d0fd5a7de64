"""commprof.perfmodel: the models every command's analysis stands on, below the commands and findings.

  alphabeta.py   α–β fit of measured (bytes, seconds) points (bench's fit, the link findings assume)
  fabric.py      a fabric of α and β per level (intra-host, inter-host), read from flags or a bench JSON
  timeline.py    a traced iteration as a program of ops per rank (what the trace measured)
  replay.py      that program re-timed on a fabric at N ranks (predict's what-if, findings' "step without it")

Exercised by: `pytest tests/unit/test_predict.py tests/unit/test_algorithm_models.py`.
"""
