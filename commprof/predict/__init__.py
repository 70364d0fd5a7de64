"""commprof.predict: a measured iteration replayed at N ranks on a fabric of given α and β per level
(`commprof predict`). The fabric, the measured iteration and its replay are commprof/perfmodel/'s;
command.py prints, saves and plots. Exercised by: `pytest tests/unit/test_predict.py`.
"""
