"""Rendering of results: Rich tables, JSON/CSV files, units. Results are plain data; this only shows them."""
