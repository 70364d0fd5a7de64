"""`tensor` refuses, before any group is made, a degree that does not divide a model's attention heads or
MLP outputs, a model with nothing to split, and a grid the ranks cannot fill: one UsageError each."""

from types import SimpleNamespace

import pytest

from commprof.base.errors import UsageError
from commprof.models import build_model
from commprof.run.config import RunConfig
from commprof.strategies.tensor import TensorParallel, check_divisible


@pytest.mark.parametrize("model,t,message", [
    ("gpt2-tiny", 3, "--tp 3 does not divide the 4 attention heads of gpt2-tiny"),
    ("bert-tiny", 4, "--tp 4 does not divide the 2 attention heads of bert-tiny"),
    ("mnist-cnn", 3, "--tp 3 does not divide the 50 outputs of fc1 in mnist-cnn"),
    ("resnet18", 2, "model resnet18 has no MLP head or attention to split"),
])
def test_what_cannot_split(model, t, message):
    with pytest.raises(UsageError, match=message):
        check_divisible(build_model(model, in_channels=1 if model == "mnist-cnn" else 3, image_size=28), t, model)


@pytest.mark.parametrize("extra,message", [({"tp": 3}, "attention heads"), ({"dp": 3}, "at least 2")])
def test_bad_degree_fails_before_any_group(extra, message):
    comm = SimpleNamespace(rank=0, world_size=3)  # no new_group: reaching the grid would be an AttributeError
    config = RunConfig(strategy="tensor", model="gpt2-tiny", backend="gloo", **extra)
    with pytest.raises(UsageError, match=message):
        TensorParallel(spec=build_model("gpt2-tiny"), comm=comm, config=config)
