"""Ctrl-C lost on rank 0, seen by rank 1: rank 0's KeyboardInterrupt raised in a __del__ (Python prints it and
goes on), rank 1's ending it, so that rank 0's next collective fails for the peer the Ctrl-C took. Exercised by
`pytest tests/test_profile_failures.py -k dropped`."""
import signal

import torch
import torch.distributed as dist


class Dropping:
    def __del__(self):  # what is raised here Python can only print: the KeyboardInterrupt is lost
        signal.raise_signal(signal.SIGINT)


dist.init_process_group()
rank = dist.get_rank()
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    model(torch.ones(2, 8)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if step == 4:
        if rank == 0:
            Dropping()
        else:
            signal.raise_signal(signal.SIGINT)
