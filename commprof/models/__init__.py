"""The model zoo: every model a run can train, by name, with the stages that sharding strategies wrap.

    torch.manual_seed(seed)                      # every weight comes from the global RNG
    spec = build_model("resnet18", num_classes=10, in_channels=3, image_size=32)
    logits = spec.module(images)                 # spec.task says which loss; spec.units what to wrap

Image models: mnist-cnn (`cnn.py`) and six torchvision classifiers (`vision.py`, optionally as a frozen
feature extractor under a trained head, `frozen.py`). Text models: GPT-2 and BERT styles
(`gpt2.py`, `bert.py`, sharing `transformer.py`). No weights are ever downloaded and no model has
dropout. `list_models()` is what --list-models prints. Exercised by: `pytest tests/unit/test_models.py`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

from commprof.base.errors import UsageError
from commprof.models.spec import ModelEntry, ModelSpec

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MODELS", "ModelEntry", "ModelSpec", "build_model", "count_parameters", "list_models"]


def _lazy(module: str, *args: str, preset: str | None = None) -> Callable[..., ModelSpec]:
    """commprof.models.<module>.build(*args, preset=<the module's preset>, …), the module (and torch)
    imported when the model is built: checking --model loads neither."""
    def build(**sizes) -> ModelSpec:
        found = importlib.import_module(f"{__name__}.{module}")
        extra = {"preset": getattr(found, preset)} if preset else {}
        return found.build(*args, **extra, **sizes)
    return build


# Counts are at build_model's defaults (3×32×32 images, 10 classes; vocab 65, seq_len 64) unless the
# line says otherwise; tests/unit/test_models.py checks each one against the built model.
MODELS: dict[str, ModelEntry] = {
    "mnist-cnn": ModelEntry(_lazy("cnn"), "image",
                            "PyTorch's MNIST example CNN, 21,840 params at 1x28x28", image_size=28, in_channels=1),
    "resnet18": ModelEntry(_lazy("vision", "resnet18"), "image",
                           "torchvision ResNet-18, 11,181,642 params"),
    "mobilenet_v2": ModelEntry(_lazy("vision", "mobilenet_v2"), "image",
                               "torchvision MobileNetV2, 2,236,682 params"),
    "vgg16": ModelEntry(_lazy("vision", "vgg16"), "image",
                        "torchvision VGG-16 (no 5th max-pool), 134,301,514 params"),
    "alexnet": ModelEntry(_lazy("vision", "alexnet"), "image",
                          "torchvision AlexNet (first conv stride 1), 57,044,810 params"),
    "densenet121": ModelEntry(_lazy("vision", "densenet121"), "image",
                              "torchvision DenseNet-121 (no stem max-pool), 6,964,106 params"),
    "squeezenet1_0": ModelEntry(_lazy("vision", "squeezenet1_0"), "image",
                                "torchvision SqueezeNet 1.0, 740,554 params"),
    "gpt2": ModelEntry(_lazy("gpt2", preset="GPT2"), "text",
                       "GPT-2-style decoder, 12 layers x 432, 27,025,920 params"),
    "gpt2-tiny": ModelEntry(_lazy("gpt2", preset="GPT2_TINY"), "text",
                            "GPT-2-style decoder, 2 layers x 32, 31,680 params (tests)"),
    "bert": ModelEntry(_lazy("bert", preset="BERT"), "text",
                       "BERT-style MLM encoder, 12 layers x 576, 48,312,065 params", masked_lm=True),
    "bert-tiny": ModelEntry(_lazy("bert", preset="BERT_TINY"), "text",
                            "BERT-style MLM encoder, 2 layers x 32, 32,865 params (tests)", masked_lm=True),
}


def _require_positive(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise UsageError(f"{key} must be at least 1, got {value}")


def build_model(name: str, *, num_classes: int = 10, in_channels: int = 3, image_size: int = 32,
                vocab_size: int = 65, seq_len: int = 64, frozen_backbone: bool = False,
                head_width: int = 4096) -> ModelSpec:
    """Model `name` built for the given input and output sizes; sizes that do not apply are ignored.

    `frozen_backbone` (torchvision models only) turns the model into a fixed feature extractor under
    a trained 3-layer head whose hidden layers are `head_width` wide. Raises UsageError for an unknown name or a
    combination that cannot work.
    """
    entry = MODELS.get(name)
    if entry is None:
        raise UsageError(f"unknown model '{name}': choose from {', '.join(MODELS)}")
    if entry.kind == "text":
        if frozen_backbone:
            raise UsageError(f"a frozen backbone needs a torchvision image model; '{name}' is a text model")
        _require_positive(vocab_size=vocab_size, seq_len=seq_len)
        return entry.build(vocab_size=vocab_size, seq_len=seq_len)
    _require_positive(num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                      head_width=head_width)
    return entry.build(num_classes=num_classes, in_channels=in_channels, image_size=image_size,
                       frozen_backbone=frozen_backbone, head_width=head_width)


def list_models() -> list[tuple[str, str, str]]:
    """(name, kind, description) for every model, in MODELS order."""
    return [(name, entry.kind, entry.description) for name, entry in MODELS.items()]


def count_parameters(module: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameter elements in `module` (each shared tensor once), by default trainable ones."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
