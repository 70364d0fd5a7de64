"""Data sources read back small real-format files exactly; sampling is rank-count independent."""

import pickle
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.idx_files import write_idx

from commprof.base.errors import UsageError
from commprof.data import Batch, global_indices, open_source, shard, steps_per_epoch


def mnist_arrays(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)


@pytest.fixture
def mnist_dir(tmp_path):
    train, test = mnist_arrays(12, 1), mnist_arrays(5, 2)
    write_idx(tmp_path / "train-images-idx3-ubyte", train[0])
    write_idx(tmp_path / "train-labels-idx1-ubyte", train[1])
    write_idx(tmp_path / "t10k-images-idx3-ubyte", test[0], gz=True)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", test[1], gz=True)
    return tmp_path, train, test


def pixels(source, batch):
    """Undo the normalisation: back to 0-255."""
    mean = torch.tensor(source.mean).view(1, -1, 1, 1)
    std = torch.tensor(source.std).view(1, -1, 1, 1)
    return ((batch.x * std + mean) * 255).round().to(torch.uint8)


def test_mnist_reads_pixels_labels_and_test_split(mnist_dir):
    root, train, test = mnist_dir
    s = open_source("mnist", data_dir=str(root), seed=0)
    assert (s.name, s.kind, s.num_samples, s.num_classes, s.in_channels, s.image_size) == \
        ("mnist", "image", 12, 10, 1, 28)
    b = s.get(torch.tensor([3, 0, 11]))
    assert b.x.shape == (3, 1, 28, 28) and b.x.dtype == torch.float32 and b.y.dtype == torch.int64
    assert torch.equal(pixels(s, b)[:, 0], torch.from_numpy(train[0][[3, 0, 11]]))
    assert b.y.tolist() == train[1][[3, 0, 11]].tolist()
    with pytest.raises(UsageError, match="mnist has 10 classes, not 100"):
        open_source("mnist", data_dir=str(root), seed=0, num_classes=100)
    h = s.heldout  # from the .gz t10k files
    assert h.num_samples == 5 and h.heldout is None
    hb = h.get(torch.arange(5))
    assert torch.equal(pixels(h, hb)[:, 0], torch.from_numpy(test[0]))
    assert hb.y.tolist() == test[1].tolist()


def test_mnist_channels_size_subset_and_torchvision_layout(tmp_path, mnist_dir):
    root, train, _ = mnist_dir
    raw = tmp_path / "tv" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in root.glob("*-ubyte*"):
        (raw / f.name).write_bytes(f.read_bytes())
    s = open_source("mnist", data_dir=str(tmp_path / "tv"), seed=0, in_channels=3, image_size=32, num_samples=10)
    assert (s.num_samples, s.in_channels, s.image_size) == (10, 3, 32)
    b = s.get(torch.tensor([2]))
    assert b.x.shape == (1, 3, 32, 32)
    assert torch.equal(b.x[:, 0], b.x[:, 2])  # grey repeated
    want = F.interpolate(torch.from_numpy(train[0][[2]]).float()[:, None] / 255, size=(32, 32), mode="bilinear")
    assert torch.allclose(b.x[:, :1] * 0.3081 + 0.1307, want, atol=1e-5)


def test_mnist_missing_corrupt_and_bad_magic(tmp_path, mnist_dir):
    with pytest.raises(UsageError, match=r"mnist: .*empty/train-images-idx3-ubyte\(\.gz\) not found; put the MNIST"):
        open_source("mnist", data_dir=str(tmp_path / "empty"), seed=0)
    root, train, _ = mnist_dir
    write_idx(root / "train-images-idx3-ubyte", train[0], magic=2049)
    with pytest.raises(UsageError, match=r"train-images-idx3-ubyte is not an IDX images file \(magic number 2049"):
        open_source("mnist", data_dir=str(root), seed=0)
    (root / "train-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, 12, 28, 28) + b"\0" * 100)
    with pytest.raises(UsageError, match=r"train-images-idx3-ubyte is corrupt"):
        open_source("mnist", data_dir=str(root), seed=0)
    (root / "train-images-idx3-ubyte").unlink()
    (root / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UsageError, match=r"cannot read .*train-images-idx3-ubyte\.gz"):
        open_source("mnist", data_dir=str(root), seed=0)


def write_cifar(folder, files, label_key, num_classes, n, seed):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    out = {}
    for name in files:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, num_classes, n).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": b"x", label_key: labels, b"data": data}, f)
        out[name] = (data.reshape(n, 3, 32, 32), labels)
    return out


@pytest.mark.parametrize("parent", [True, False])
def test_cifar10_batches_in_order_and_test_split(tmp_path, parent):
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    written = write_cifar(tmp_path / "cifar-10-batches-py", files, b"labels", 10, 3, 0)
    s = open_source("cifar10", data_dir=str(tmp_path if parent else tmp_path / "cifar-10-batches-py"), seed=0)
    assert (s.num_samples, s.num_classes, s.in_channels, s.image_size) == (15, 10, 3, 32)
    b = s.get(torch.arange(15))
    images = np.concatenate([written[f][0] for f in files[:5]])
    assert torch.equal(pixels(s, b), torch.from_numpy(images))
    assert b.y.tolist() == sum((written[f][1] for f in files[:5]), [])
    hb = s.heldout.get(torch.arange(3))
    assert torch.equal(pixels(s.heldout, hb), torch.from_numpy(written["test_batch"][0]))
    assert hb.y.tolist() == written["test_batch"][1]


def test_cifar100_fine_labels_grey_and_resize(tmp_path):
    written = write_cifar(tmp_path / "cifar-100-python", ["train", "test"], b"fine_labels", 100, 4, 1)
    s = open_source("cifar100", data_dir=str(tmp_path), seed=0, in_channels=1, image_size=28)
    assert (s.num_samples, s.num_classes, s.in_channels, s.image_size) == (4, 100, 1, 28)
    b = s.get(torch.tensor([1, 3]))
    assert b.x.shape == (2, 1, 28, 28) and b.y.tolist() == [written["train"][1][i] for i in (1, 3)]
    rgb = torch.from_numpy(written["train"][0][[1, 3]]).float() / 255
    grey = (rgb * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    want = F.interpolate(grey, size=(28, 28), mode="bilinear", antialias=True)
    assert torch.allclose(b.x * s.std[0] + s.mean[0], want, atol=1e-5)
    assert s.heldout.num_samples == 4


def test_cifar_missing_and_corrupt(tmp_path):
    with pytest.raises(UsageError, match=r"cifar10: .*cifar-10-batches-py/data_batch_1 not found; put the CIFAR-10"):
        open_source("cifar10", data_dir=str(tmp_path), seed=0)
    write_cifar(tmp_path / "cifar-100-python", ["train"], b"labels", 100, 2, 0)  # wrong label key
    with pytest.raises(UsageError, match=r"cifar-100-python/train is not a CIFAR-100 python batch"):
        open_source("cifar100", data_dir=str(tmp_path), seed=0)
    (tmp_path / "cifar-100-python" / "train").write_bytes(pickle.dumps(print))  # not an array: refused
    with pytest.raises(UsageError, match=r"cannot read .*cifar-100-python/train"):
        open_source("cifar100", data_dir=str(tmp_path), seed=0)


TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40))


def test_text_windows_vocab_and_heldout(tmp_path):
    (tmp_path / "input.txt").write_text(TEXT, encoding="utf-8")
    s = open_source("text", data_dir=str(tmp_path), seed=0, seq_len=16, task="lm")
    vocab = sorted(set(TEXT))
    split = len(TEXT) - len(TEXT) // 10
    assert s.num_classes == len(vocab) and s.vocab == "".join(vocab)
    assert (s.kind, s.seq_len, s.num_samples) == ("text", 16, (split - 1) // 16)
    b = s.get(torch.tensor([0, 5]))
    assert b.x.shape == b.y.shape == (2, 16) and b.x.dtype == torch.int64
    assert s.decode(b.x[1]) == TEXT[80:96] and s.decode(b.y[1]) == TEXT[81:97]
    h = open_source("text", data_dir=str(tmp_path / "input.txt"), seed=0, seq_len=16, task="lm").heldout
    assert h.num_samples == (len(TEXT) // 10 - 1) // 16
    assert h.decode(h.get(torch.tensor([1])).x[0]) == TEXT[split + 16:split + 32]


def test_text_missing_and_too_short(tmp_path):
    with pytest.raises(UsageError, match=r"text: .*nope.txt not found"):
        open_source("text", data_dir=str(tmp_path / "nope.txt"), seed=0, task="lm")
    (tmp_path / "short.txt").write_text("abc")
    with pytest.raises(UsageError, match="too short"):
        open_source("text", data_dir=str(tmp_path / "short.txt"), seed=0, task="lm")


@pytest.mark.parametrize("name", ["text", "synthetic"])
def test_mlm_fixed_mask_count(tmp_path, name):
    (tmp_path / "input.txt").write_text(TEXT)
    lm = open_source(name, data_dir=str(tmp_path), seed=3, seq_len=20, task="lm")
    mlm = open_source(name, data_dir=str(tmp_path), seed=3, seq_len=20, task="mlm")
    assert mlm.num_classes == lm.num_classes + 1 and mlm.mask_id == lm.num_classes and mlm.task == "mlm"
    idx = torch.arange(min(mlm.num_samples, 40))
    orig, b = lm.get(idx).x, mlm.get(idx)
    masked = b.y != -100
    assert masked.sum(1).tolist() == [3] * len(idx)  # round(0.15 * 20)
    assert torch.equal(b.x[masked], torch.full((3 * len(idx),), mlm.mask_id))
    assert torch.equal(b.y[masked], orig[masked]) and torch.equal(b.x[~masked], orig[~masked])
    assert torch.equal(mlm.get(idx[5:6]).x, b.x[5:6])  # positions depend on the sample, not the batch
    other = open_source(name, data_dir=str(tmp_path), seed=4, seq_len=20, task="mlm")
    assert not torch.equal((other.get(idx).y != -100), masked)
    assert mlm.heldout.get(torch.tensor([0])).y.ne(-100).sum() == 3


def test_global_indices_permutation_and_wrap():
    n, g = 10, 4
    assert steps_per_epoch(n, g) == 3
    steps = [global_indices(n, seed=1, epoch=0, step=t, global_batch=g) for t in range(3)]
    assert all(len(s) == g for s in steps)
    flat = torch.cat(steps)
    assert sorted(flat[:n].tolist()) == list(range(n))
    assert torch.equal(flat[n:], flat[:2])  # the last step wraps to the start of the permutation
    other = torch.cat([global_indices(n, seed=1, epoch=1, step=t, global_batch=g) for t in range(3)])
    assert sorted(other[:n].tolist()) == list(range(n)) and not torch.equal(other, flat)
    assert torch.equal(global_indices(n, seed=1, epoch=0, step=2, global_batch=g), steps[2])
    with pytest.raises(UsageError, match="outside the epoch"):
        global_indices(n, seed=1, epoch=0, step=3, global_batch=g)


@pytest.mark.parametrize("task", ["classify", "lm", "mlm"])
def test_shards_concatenate_to_the_global_batch(task):
    s = open_source("synthetic", data_dir=None, seed=0, task=task, num_samples=100, image_size=8, seq_len=8)
    idx = global_indices(s.num_samples, seed=0, epoch=2, step=1, global_batch=12)
    whole = s.get(idx)
    for k in (1, 2, 3):
        parts = [shard(whole, rank=r, world_size=k) for r in range(k)]
        assert torch.equal(torch.cat([p.x for p in parts]), whole.x)
        assert torch.equal(torch.cat([p.y for p in parts]), whole.y)
        # sharding the indices first gives each rank the same samples
        for r, p in enumerate(parts):
            local = s.get(shard(idx, rank=r, world_size=k))
            assert torch.equal(local.x, p.x) and torch.equal(local.y, p.y)
    with pytest.raises(UsageError, match="global batch 12 is not divisible by world size 5"):
        shard(whole, rank=0, world_size=5)


@pytest.mark.parametrize("task", ["classify", "lm"])
def test_synthetic_determinism(task):
    def make(seed):
        return open_source("synthetic", data_dir=None, seed=seed, task=task)
    idx = torch.tensor([0, 17, 49_999])
    a, b, c = make(0).get(idx), make(0).get(idx), make(1).get(idx)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, c.x)
    h = make(0).heldout.get(idx[:2])
    assert not torch.equal(h.x, a.x[:2])  # the held-out split is a different set


def test_synthetic_image_shapes_and_learnable():
    s = open_source("synthetic", data_dir=None, seed=0, in_channels=1)
    assert (s.name, s.in_channels, s.image_size, s.num_samples, s.num_classes) == ("synthetic-image", 1, 28, 60_000, 10)
    s = open_source("synthetic", data_dir=None, seed=0, num_classes=5, image_size=16)
    b = s.get(torch.arange(400))
    assert b.x.shape == (400, 3, 16, 16) and b.y.max() < 5 and b.x.dtype == torch.float32
    torch.manual_seed(0)
    model = torch.nn.Linear(3 * 16 * 16, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(b.x.flatten(1)), b.y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_synthetic_text_follows_its_chain():
    s = open_source("synthetic", data_dir=None, seed=0, task="lm", seq_len=32)
    assert (s.name, s.kind, s.num_classes) == ("synthetic-text", "text", 65)
    b = s.get(torch.arange(200))
    assert torch.equal(b.x[:, 1:], b.y[:, :-1])
    # the transitions taken are mostly the chain's likely ones: far below ln(65) nats of surprise
    nll = -s.transitions[b.x.flatten(), b.y.flatten()].log().mean()
    assert nll < 2.0


def test_bad_requests():
    with pytest.raises(UsageError, match="unknown data source 'imagenet'; choose from synthetic, mnist, cifar10"):
        open_source("imagenet", data_dir=None, seed=0)
    with pytest.raises(UsageError, match="give --data-dir"):
        open_source("mnist", data_dir=None, seed=0)
    with pytest.raises(UsageError, match="task lm needs text data"):
        open_source("cifar10", data_dir="/x", seed=0, task="lm")
    with pytest.raises(UsageError, match="unknown task"):
        open_source("synthetic", data_dir=None, seed=0, task="regress")
    assert isinstance(Batch(x=torch.zeros(2), y=torch.zeros(2)), Batch)
