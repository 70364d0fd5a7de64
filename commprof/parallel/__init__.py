"""The building blocks strategies are made of: process grids (`grid.py`), layer partitions
(`partition.py`), flat sharded buffers (`flat.py`), mixed precision (`precision.py`), pipeline
schedules (`schedule.py`) and the byte count of tensors (`sizes.py`).

Nothing here is a strategy or knows the Strategy interface (`commprof/strategies/base.py`): each piece
is a plain function or class that a strategy in `commprof/strategies/` composes, so it can be tested
on its own. Exercised by: `pytest tests/test_pipeline.py tests/test_strategies.py`.
"""
