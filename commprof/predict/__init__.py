"""commprof.predict: a measured iteration replayed at N ranks on a fabric of given α and β per level
(`commprof predict`). fabric.py reads the fabric, timeline.py the measured iteration from a trace,
replay.py re-times it, command.py prints, saves and plots. Exercised by: `pytest tests/unit/test_predict.py`.
"""
