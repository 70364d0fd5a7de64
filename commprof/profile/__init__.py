"""`commprof profile`: any torch.distributed training script, measured as `commprof run` measures its own."""
