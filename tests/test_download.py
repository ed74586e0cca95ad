"""Download-backed datasets against a local HTTP server: real formats, tiny files, no internet.

Each test writes a few images in the real on-disk format (CIFAR pickles in a tar.gz, MNIST idx
gzip files, SVHN .mat), serves them from 127.0.0.1 and points the dataset's ``mirror`` at the
server. torchvision's recorded MD5s are patched to the tiny files' true MD5s, so (a) a correct
download loads with the right shapes and labels and (b) a tampered file fails the checksum.
The last section plays misbehaving servers (trickling, oversized, lying about their size)
against :func:`gradinv.data.download.download` and the command line.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pickle
import re
import struct
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from torchvision import datasets

from gradinv.cli import main
from gradinv.data import DATASETS, DownloadError, dataset_settings
from gradinv.data.download import CHUNK_BYTES, download

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


# --- Misbehaving servers: deadline, byte limit, Content-Length, the command line ------------------

BODY = bytes(range(256)) * 400  # 102,400 bytes, the "official" file of these tests
BODY_MD5 = hashlib.md5(BODY).hexdigest()


def leftovers(folder: Path) -> list[str]:
    """What a refused download left in ``folder``, temporary files included."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_file_of_known_size_downloads(server, tmp_path):
    url = server.serve("ok.bin", BODY)
    dest = download([url], tmp_path / "raw" / "ok.bin", BODY_MD5, name="test", size=len(BODY))
    assert dest.read_bytes() == BODY and leftovers(dest.parent) == ["ok.bin"]


def test_a_trickling_server_is_abandoned_at_the_deadline(server, tmp_path):
    # One byte every 50 ms: every read succeeds, so only an overall deadline stops it (~85 min).
    url = server.stream("slow.bin", [b"x"] * len(BODY), length=len(BODY), pause=0.05)
    dest = tmp_path / "raw" / "slow.bin"
    start = time.monotonic()
    with pytest.raises(DownloadError) as err:
        download([url], dest, BODY_MD5, name="test", size=len(BODY), deadline_s=1.0)
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert 1.0 <= elapsed < 2.0
    assert f"{url} did not deliver slow.bin within its 1.0 s deadline" in message
    assert f"put the verified file at {dest} by hand" in message and "\n" not in message
    assert 0 < server.sent["/slow.bin"] < 100
    assert leftovers(dest.parent) == []


def test_a_stream_larger_than_the_known_size_is_cut_off_at_it(server, tmp_path):
    # 64 MiB without a Content-Length (the body ends when the connection closes).
    url = server.stream("big.bin", [b"x" * 65536] * 1024, length=None)
    dest = tmp_path / "raw" / "big.bin"
    with pytest.raises(DownloadError) as err:
        download([url], dest, BODY_MD5, name="test", size=len(BODY))
    message = str(err.value)
    assert f"{url} sent more than the {len(BODY)} bytes of big.bin" in message
    refused_at = int(re.search(r"refused at (\d+) bytes", message).group(1))
    assert len(BODY) < refused_at <= len(BODY) + CHUNK_BYTES  # the first read past the size
    assert server.sent["/big.bin"] < 16 << 20  # the rest was never sent (socket buffers aside)
    assert leftovers(dest.parent) == []


def test_a_short_stream_is_refused(server, tmp_path):
    url = server.stream("short.bin", [BODY[:1000]], length=None)
    dest = tmp_path / "raw" / "short.bin"
    with pytest.raises(DownloadError, match=f"ended short.bin after 1000 of its {len(BODY)} bytes"):
        download([url], dest, BODY_MD5, name="test", size=len(BODY))
    assert leftovers(dest.parent) == []


def test_a_content_length_that_disagrees_with_the_known_size_is_refused_unread(server, tmp_path):
    # The body would follow 3 s after the headers: a download that read it would take that long.
    url = server.stream("lie.bin", [BODY * 2], length=2 * len(BODY), pause=3.0)
    dest = tmp_path / "raw" / "lie.bin"
    start = time.monotonic()
    with pytest.raises(DownloadError) as err:
        download([url], dest, BODY_MD5, name="test", size=len(BODY))
    assert time.monotonic() - start < 1.0
    assert (
        f"{url} announced {2 * len(BODY)} bytes for lie.bin (its Content-Length), but the "
        f"official file has {len(BODY)}" in str(err.value)
    )
    assert server.sent["/lie.bin"] == 0 and leftovers(dest.parent) == []


def test_every_file_the_loaders_download_has_its_size_recorded():
    """Sizes are keyed by torchvision's MD5s: a checksum torchvision changes shows up here."""
    from gradinv.data import cifar, mnist, svhn

    assert cifar.SIZES[datasets.CIFAR10.tgz_md5] == 170_498_071
    assert cifar.SIZES[datasets.CIFAR100.tgz_md5] == 169_001_437
    assert [mnist.SIZES[md5] for _, md5 in datasets.MNIST.resources] == [
        9_912_422,
        28_881,
        1_648_877,
        4_542,
    ]
    svhn_md5 = {split: md5 for split, (_, _, md5) in datasets.SVHN.split_list.items()}
    assert svhn.SIZES[svhn_md5["train"]] == 182_040_794
    assert svhn.SIZES[svhn_md5["test"]] == 64_275_384


def test_the_command_line_prints_a_refused_download_as_one_line(server, tmp_path, capsys):
    # MNIST's official first file has a known size (9,912,422 bytes); this mirror announces 5.
    url = server.stream("train-images-idx3-ubyte.gz", [b"x" * 5], length=5)
    settings = {"dataset": "mnist", "settings": {"mirror": server.url}, "seed": 0}
    raw, out = tmp_path / "raw", tmp_path / "prepared" / "mnist.pt"
    code = main(
        ["prepare", "--settings", json.dumps(settings), "--raw-dir", str(raw), "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err
    progress = [line for line in err.splitlines() if line.startswith("mnist: downloading ")]
    [refusal] = [line for line in err.splitlines() if line not in progress]
    assert refusal.startswith("gradinv prepare: bad input: mnist: no verified copy of ")
    assert f"{url} announced 5 bytes" in refusal and "9912422" in refusal
    assert "data.sources.mnist.mirror" in refusal and "by hand" in refusal
    assert not out.exists() and leftovers(raw / "mnist" / "MNIST" / "raw") == []
