"""Clocks, op records and statistics: how commprof turns calls into numbers."""
