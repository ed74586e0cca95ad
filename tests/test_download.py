"""Download-backed datasets against a local HTTP server: real formats, tiny files, no internet.

Each test writes a few images in the real on-disk format (CIFAR pickles in a tar.gz, MNIST idx
gzip files, SVHN .mat), serves them from 127.0.0.1 and points the dataset's ``mirror`` at the
server. torchvision's recorded MD5s are patched to the tiny files' true MD5s, so (a) a correct
download loads with the right shapes and labels and (b) a tampered file fails the checksum.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from torchvision import datasets

from gradinv.data import DATASETS, DownloadError, dataset_settings

RNG = np.random.default_rng(0)


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def serve_good_and_bad(www: Path, files: dict[str, bytes]) -> None:
    """The same files under good/ and, each with one byte flipped, under bad/."""
    for folder in ("good", "bad"):
        for name, data in files.items():
            path = www / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if folder == "bad":
                tamper(path)


def load(name: str, settings: dict, root: Path):
    return DATASETS.get(name).load(dataset_settings(name, settings), root, seed=0)


# --- CIFAR-10 / CIFAR-100 ------------------------------------------------------------------------

CIFAR = {
    "cifar10": dict(
        tv=datasets.CIFAR10,
        batches={**{f"data_batch_{i}": 2 for i in range(1, 6)}, "test_batch": 3},
        meta="batches.meta",
        key="label_names",
        labels="labels",
        classes=10,
    ),
    "cifar100": dict(
        tv=datasets.CIFAR100,
        batches={"train": 6, "test": 3},
        meta="meta",
        key="fine_label_names",
        labels="fine_labels",
        classes=100,
    ),
}


def cifar_archive(tmp: Path, name: str, monkeypatch) -> tuple[bytes, dict[str, np.ndarray]]:
    """A real-format CIFAR archive with a few images; torchvision's MD5s patched to match."""
    spec = CIFAR[name]
    tv = spec["tv"]
    folder = tmp / "build" / tv.base_folder
    folder.mkdir(parents=True)
    written = {}
    for batch, n in spec["batches"].items():
        data = RNG.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = RNG.integers(0, spec["classes"], size=n).tolist()
        written[batch] = (data, labels)
        with open(folder / batch, "wb") as f:
            pickle.dump({"data": data, spec["labels"]: labels, "batch_label": batch}, f)
    with open(folder / spec["meta"], "wb") as f:
        pickle.dump({spec["key"]: [f"class{i}" for i in range(spec["classes"])]}, f)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=tv.base_folder)
    archive = buf.getvalue()
    train = [[b, md5(folder / b)] for b in spec["batches"] if "test" not in b]
    test = [[b, md5(folder / b)] for b in spec["batches"] if "test" in b]
    monkeypatch.setattr(tv, "tgz_md5", hashlib.md5(archive).hexdigest())
    monkeypatch.setattr(tv, "train_list", train)
    monkeypatch.setattr(tv, "test_list", test)
    monkeypatch.setattr(tv, "meta", {**tv.meta, "md5": md5(folder / spec["meta"])})
    return archive, written


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_downloads_from_mirror_and_loads(name, server, tmp_path, monkeypatch):
    archive, written = cifar_archive(tmp_path, name, monkeypatch)
    serve_good_and_bad(server.root, {CIFAR[name]["tv"].filename: archive})
    raw = load(name, {"mirror": f"{server.url}/good/"}, tmp_path / "raw")
    assert set(server.requests) == {f"/good/{CIFAR[name]['tv'].filename}"}
    train = [b for b in CIFAR[name]["batches"] if "test" not in b]
    data = np.concatenate([written[b][0] for b in train])
    labels = [y for b in train for y in written[b][1]]
    assert raw.train_images.shape == (len(labels), 3, 32, 32)
    assert raw.train_images.dtype == torch.uint8
    assert torch.equal(raw.train_images, torch.from_numpy(data.reshape(-1, 3, 32, 32)))
    assert raw.train_labels.tolist() == labels
    test = next(b for b in CIFAR[name]["batches"] if "test" in b)
    assert raw.val_labels.tolist() == written[test][1]
    assert len(raw.classes) == CIFAR[name]["classes"] and raw.classes[1] == "class1"
    # Second load: files already there and verified, nothing fetched; resizing applies.
    fetched = len(server.requests)
    small = load(name, {"mirror": f"{server.url}/good/", "image_size": 16}, tmp_path / "raw")
    assert len(server.requests) == fetched and small.val_images.shape[1:] == (3, 16, 16)


def test_cifar_tampered_archive_fails_its_checksum(server, tmp_path, monkeypatch):
    archive, _ = cifar_archive(tmp_path, "cifar10", monkeypatch)
    serve_good_and_bad(server.root, {datasets.CIFAR10.filename: archive})
    with pytest.raises(DownloadError) as err:
        load("cifar10", {"mirror": f"{server.url}/bad"}, tmp_path / "raw")
    assert "corrupted" in str(err.value) and f"{server.url}/bad/" in str(err.value)
    assert "data.sources.cifar10.mirror" in str(err.value)
    assert set(server.requests) == {"/bad/cifar-10-python.tar.gz"}


# --- MNIST ---------------------------------------------------------------------------------------


def idx_gz(array: np.ndarray) -> bytes:
    """The idx format of LeCun's MNIST files: magic (0, 0, 0x08 uint8, ndim), sizes, data."""
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes(), mtime=0)


def mnist_files(monkeypatch) -> tuple[dict[str, bytes], dict[str, np.ndarray]]:
    arrays = {
        "train-images-idx3-ubyte.gz": RNG.integers(0, 256, (7, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": RNG.integers(0, 10, 7, dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": RNG.integers(0, 256, (4, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": RNG.integers(0, 10, 4, dtype=np.uint8),
    }
    files = {name: idx_gz(a) for name, a in arrays.items()}
    monkeypatch.setattr(
        datasets.MNIST,
        "resources",
        [(name, hashlib.md5(data).hexdigest()) for name, data in files.items()],
    )
    return files, arrays


def test_mnist_downloads_from_mirror_and_loads(server, tmp_path, monkeypatch):
    files, arrays = mnist_files(monkeypatch)
    serve_good_and_bad(server.root, files)
    raw = load("mnist", {"mirror": f"{server.url}/good", "image_size": 28}, tmp_path / "raw")
    assert set(server.requests) == {f"/good/{f}" for f in files}
    assert raw.train_images.shape == (7, 1, 28, 28) and raw.val_images.shape == (4, 1, 28, 28)
    assert torch.equal(
        raw.train_images[:, 0], torch.from_numpy(arrays["train-images-idx3-ubyte.gz"])
    )
    assert raw.val_labels.tolist() == arrays["t10k-labels-idx1-ubyte.gz"].tolist()
    assert raw.classes == tuple("0123456789")
    resized = load("mnist", {"mirror": f"{server.url}/good"}, tmp_path / "raw")
    assert resized.train_images.shape == (7, 1, 32, 32)  # DLG's 32x32 by default


def test_mnist_tampered_file_fails_its_checksum(server, tmp_path, monkeypatch):
    files, _ = mnist_files(monkeypatch)
    serve_good_and_bad(server.root, files)
    with pytest.raises(DownloadError, match="corrupted"):
        load("mnist", {"mirror": f"{server.url}/bad"}, tmp_path / "raw")


# --- SVHN ----------------------------------------------------------------------------------------


def svhn_files(tmp: Path, monkeypatch) -> tuple[dict[str, bytes], dict[str, np.ndarray]]:
    files, labels = {}, {}
    split_list = {}
    for split, n in (("train", 5), ("test", 3)):
        name = f"{split}_32x32.mat"
        y = RNG.integers(1, 11, size=(n, 1), dtype=np.uint8)  # SVHN stores digit 0 as 10
        path = tmp / name
        scipy.io.savemat(path, {"X": RNG.integers(0, 256, (32, 32, 3, n), dtype=np.uint8), "y": y})
        files[name], labels[split] = path.read_bytes(), y[:, 0] % 10
        url, fname, _ = datasets.SVHN.split_list[split]
        split_list[split] = [url, fname, md5(path)]
    monkeypatch.setattr(datasets.SVHN, "split_list", {**datasets.SVHN.split_list, **split_list})
    return files, labels


def test_svhn_downloads_from_mirror_and_loads(server, tmp_path, monkeypatch):
    files, labels = svhn_files(tmp_path, monkeypatch)
    serve_good_and_bad(server.root, files)
    raw = load("svhn", {"mirror": f"{server.url}/good"}, tmp_path / "raw")
    assert raw.train_images.shape == (5, 3, 32, 32)
    assert raw.train_labels.tolist() == labels["train"].tolist()
    assert raw.val_labels.tolist() == labels["test"].tolist()
    with pytest.raises(DownloadError, match="corrupted"):
        load("svhn", {"mirror": f"{server.url}/bad"}, tmp_path / "raw_bad")
