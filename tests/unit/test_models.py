"""The model zoo: parameter counts, output shapes, wrap units, frozen backbones, causality, seeding."""

import warnings

import pytest
import torch
import torchvision
from torch import nn

from commprof.base.errors import UsageError
from commprof.models import MODELS, build_model, count_parameters, list_models

IMAGE_MODELS = [name for name, entry in MODELS.items() if entry.kind == "image"]
TORCHVISION = ["resnet18", "mobilenet_v2", "vgg16", "alexnet", "densenet121", "squeezenet1_0"]
TINY_TEXT = ["gpt2-tiny", "bert-tiny"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Batches of 1-2 gain nothing from intra-op threads, and on a busy machine OpenMP workers spin
    # against other processes: one thread makes this file several times faster there.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name, seed=0, **sizes):
    torch.manual_seed(seed)
    return build_model(name, **sizes)


def check_units(spec):
    """Units are disjoint submodules of the module and, in this zoo, hold every parameter."""
    modules = {id(m) for m in spec.module.modules()}
    seen = set()
    for unit in spec.units:
        assert id(unit) in modules
        ids = {id(p) for p in unit.parameters()}
        assert ids, f"unit {type(unit).__name__} holds no parameters"
        assert not ids & seen, "units overlap"
        seen |= ids
    assert {id(p) for p in spec.module.parameters()} == seen


def train_step(spec, x):
    """Forward + backward in train mode; returns the logits and the order the units ran in.

    Full backward hooks on every unit also catch in-place ops on a unit's output, which would break
    strategies that hook units.
    """
    order = []
    handles = []
    for i, unit in enumerate(spec.units):
        handles.append(unit.register_forward_hook(lambda m, a, out, i=i: order.append(i)))
        handles.append(unit.register_full_backward_hook(lambda m, gi, go: None))
    spec.module.train()
    logits = spec.module(x)
    with warnings.catch_warnings():
        # The first unit's input needs no gradient; torch says so for every such hook.
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        logits.float().square().mean().backward()
    for h in handles:
        h.remove()
    return logits, order


@pytest.mark.parametrize("in_channels,image_size,num_classes", [(1, 28, 10), (3, 32, 100)])
@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_vision_models_forward_backward(name, in_channels, image_size, num_classes):
    spec = build(name, num_classes=num_classes, in_channels=in_channels, image_size=image_size)
    assert (spec.kind, spec.task) == ("image", "classify")
    check_units(spec)
    logits, order = train_step(spec, torch.randn(2, in_channels, image_size, image_size))
    assert logits.shape == (2, num_classes)
    assert order == list(range(len(spec.units))), "units are not in forward execution order"
    assert all(p.grad is not None for p in spec.module.parameters())


def test_mnist_cnn_is_the_classic_example():
    spec = build("mnist-cnn", in_channels=1, image_size=28, num_classes=10)
    assert count_parameters(spec.module) == 21_840
    assert [type(u) for u in spec.units] == [nn.Conv2d, nn.Conv2d, nn.Linear, nn.Linear]


@pytest.mark.parametrize("name", ["resnet18", "squeezenet1_0"])
def test_vision_with_three_channels_is_torchvision_model(name):
    ours = build(name, seed=3).module
    torch.manual_seed(3)
    theirs = getattr(torchvision.models, name)(weights=None, num_classes=10)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


# Trainable parameters with a frozen backbone at 10 classes. The AlexNet, VGG-16 and DenseNet-121
# figures are the ones the DataParallel study reports for its 4096-wide head on MNIST.
FROZEN_TRAINABLE = {"resnet18": 18_923_530, "mobilenet_v2": 22_069_258, "vgg16": 119_586_826,
                    "alexnet": 54_575_114, "densenet121": 21_020_682, "squeezenet1_0": 18_923_530}


@pytest.mark.parametrize("name", TORCHVISION)
def test_frozen_backbone_trains_only_the_head(name):
    spec = build(name, in_channels=1, image_size=28, num_classes=10, frozen_backbone=True)
    check_units(spec)
    backbone, *head = spec.units
    assert [type(u) for u in head] == [nn.Linear] * 3 and head[-1].out_features == 10
    assert count_parameters(spec.module) == sum(count_parameters(u) for u in head) == FROZEN_TRAINABLE[name]
    assert count_parameters(backbone) == 0 and count_parameters(backbone, trainable_only=False) > 0
    buffers = {k: v.clone() for k, v in backbone.state_dict().items()}

    # One sample per rank must work: BatchNorm uses running stats, so nothing depends on the batch.
    logits, order = train_step(spec, torch.randn(1, 1, 28, 28))
    assert logits.shape == (1, 10) and order == [0, 1, 2, 3]
    assert not any(m.training for m in backbone.modules())
    assert all(p.grad is None for p in backbone.parameters())
    assert all(p.grad is not None for u in head for p in u.parameters())
    for k, v in backbone.state_dict().items():
        assert torch.equal(v, buffers[k]), f"{k} changed in a training step"


@pytest.mark.parametrize("width, trainable", [(2048, 55_599_114), (1024, 26_750_986)])
def test_frozen_head_width_gives_the_study_parameter_counts(width, trainable):
    # The DataParallel study's narrower VGG-16 heads: w*w + (25088 + 12)*w + 10 trainable parameters.
    spec = build("vgg16", in_channels=1, image_size=28, num_classes=10, frozen_backbone=True, head_width=width)
    assert count_parameters(spec.module) == trainable
    assert [u.out_features for u in spec.units[1:]] == [width, width, 10]


@pytest.mark.parametrize("name", TINY_TEXT)
def test_gpt2_bert_tiny_give_logits_per_position(name):
    spec = build(name, vocab_size=50, seq_len=16)
    assert spec.kind == "text" and spec.task == {"gpt2-tiny": "lm", "bert-tiny": "mlm"}[name]
    check_units(spec)
    logits, order = train_step(spec, torch.randint(0, 50, (2, 16)))
    assert logits.shape == (2, 16, 50)
    assert order == list(range(len(spec.units)))
    assert all(p.grad is not None for p in spec.module.parameters())
    with pytest.raises(ValueError, match="longer than"):
        spec.module(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("name,causal", [("gpt2-tiny", True), ("bert-tiny", False)])
def test_gpt2_is_causal_and_bert_is_not(name, causal):
    net = build(name, seq_len=12).module.eval()
    x = torch.randint(0, 65, (2, 12))
    t = 5
    y = x.clone()
    y[:, t + 1] = (y[:, t + 1] + 1) % 65
    with torch.no_grad():
        a, b = net(x), net(y)
    assert not torch.allclose(a[:, t + 1], b[:, t + 1])
    if causal:
        torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    else:
        assert not torch.allclose(a[:, t], b[:, t])


@pytest.mark.parametrize("name,sizes", [("mnist-cnn", {}), ("mobilenet_v2", {"in_channels": 1}),
                                        ("gpt2-tiny", {}), ("bert-tiny", {})])
def test_same_seed_same_parameters(name, sizes):
    first, again, other = (build(name, seed=s, **sizes).module.state_dict() for s in (7, 7, 8))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_unknown_model_names_it_and_the_choices():
    with pytest.raises(UsageError, match="unknown model 'resnet1000': choose from mnist-cnn, resnet18"):
        build_model("resnet1000")


@pytest.mark.parametrize("name,sizes,words", [
    ("gpt2-tiny", {"frozen_backbone": True}, "text model"),
    ("mnist-cnn", {"frozen_backbone": True}, "no backbone"),
    ("alexnet", {"image_size": 16}, "image_size >= 21"),
    ("mnist-cnn", {"image_size": 12}, "image_size >= 16"),
    ("resnet18", {"num_classes": 0}, "num_classes"),
    ("bert-tiny", {"seq_len": 0}, "seq_len"),
])
def test_bad_combinations_are_usage_errors(name, sizes, words):
    with pytest.raises(UsageError, match=words):
        build_model(name, **sizes)


def test_sizes_that_do_not_apply_are_ignored():
    assert build("gpt2-tiny", num_classes=0, image_size=1).kind == "text"
    assert build("squeezenet1_0", vocab_size=0, seq_len=0).kind == "image"


@pytest.mark.parametrize("name,target", [("gpt2", 27e6), ("bert", 47e6)])
def test_preset_sizes(name, target):
    assert abs(count_parameters(build(name).module) - target) <= 0.1 * target


def test_list_models_states_each_default_count():
    assert [(n, k) for n, k, _ in list_models()] == [(n, e.kind) for n, e in MODELS.items()]
    for name, _, description in list_models():
        if name in ("vgg16", "gpt2", "bert"):  # large: checked by arithmetic below and above
            continue
        sizes = {"in_channels": 1, "image_size": 28} if name == "mnist-cnn" else {}
        assert f"{count_parameters(build(name, **sizes).module):,}" in description, name
    # VGG-16 at 10 classes: torchvision's 138,357,544 at 1000 classes, minus 990 outputs of fc8.
    assert "134,301,514" in MODELS["vgg16"].description
    assert 138_357_544 - 990 * 4097 == 134_301_514


@pytest.mark.parametrize("name", ["mnist-cnn", "resnet18", "gpt2-tiny", "bert-tiny", "alexnet"])
def test_layers_chain_is_the_model(name):
    torch.manual_seed(0)
    spec = build_model(name, in_channels=1, image_size=28) if name in ("mnist-cnn", "resnet18", "alexnet") \
        else build_model(name, seq_len=16)
    spec.module.eval()
    x = torch.randn(2, 1, 28, 28) if spec.kind == "image" else torch.randint(0, 65, (2, 16))
    y = x
    for layer in spec.layers:
        y = layer(y)
    assert torch.equal(y, spec.module(x))
    owned = {id(p) for layer in spec.layers for p in layer.parameters()}
    assert owned == {id(p) for p in spec.module.parameters()}
