"""Findings: what made a measured job wait, ranked by what it costs a step (`commprof run/profile --trace`)."""
