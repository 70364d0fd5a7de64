"""`commprof bench`: one collective at a time, swept over sizes, dtypes and reduce ops (nccl-tests semantics)."""
