"""The launcher layer: a local MPI job's own network (netns), the launcher (launch), the process gloo's ranks
are forked from (rank_template), the job's life cycle every command runs through (lifecycle) and rank 0's
results kept as the job goes (kept)."""
