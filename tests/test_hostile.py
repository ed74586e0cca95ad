"""Hostile inputs: files, archives, downloads and configs crafted to run code or escape a folder.

Each test plants a marker file as the "payload" (a pickle or YAML tag that would create it, an
archive member that would land outside its folder) and checks that the input is refused with an
error naming it, and that the marker never appears. Downloads run against a local HTTP server on
127.0.0.1, as in test_download.py; nothing here touches the internet.
"""

from __future__ import annotations

import ast
import copy
import gzip
import hashlib
import io
import pickle
import re
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torchvision import datasets

from gradinv.cli import main as cli_main
from gradinv.config import load as load_config
from gradinv.data import DATASETS, DownloadError, dataset_settings
from gradinv.data.download import download, extract_tar
from gradinv.io import CorruptFileError, load_tensors, save_tensors, sha256_file
from gradinv.settings import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "gradinv"
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
RNG = np.random.default_rng(0)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def files_under(folder: Path) -> dict[Path, bytes | None]:
    """Every path below ``folder`` with its bytes (None for folders), links not followed."""
    return {
        p: (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
        for p in sorted(folder.rglob("*"))
    }


class Payload:
    """Unpickling this creates ``marker``: what a hostile pickle would do, made observable."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


# --- 1. deserialisation never runs code ----------------------------------------------------------


def calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def dotted(func: ast.expr) -> str:
    """``torch.load`` for ``torch.load(...)``, ``eval`` for ``eval(...)``, else ''."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = dotted(func.value)
        return f"{inner}.{func.attr}" if inner else ""
    return ""


TORCH_LOADS = {"torch.load", "torch.serialization.load"}


SOURCES = sorted(SRC.rglob("*.py"))


def test_every_torch_load_in_src_passes_weights_only_true():
    found, bad = 0, []
    for path in SOURCES:
        for call in calls(ast.parse(path.read_text(), filename=str(path))):
            if dotted(call.func) not in TORCH_LOADS:
                continue
            found += 1
            flag = next((k.value for k in call.keywords if k.arg == "weights_only"), None)
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                bad.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert found, "no torch.load call found: has the package moved?"
    assert not bad, f"torch.load without weights_only=True at {', '.join(bad)}"


# Each of these can run code hidden in the data it reads; src/ uses none of them.
UNSAFE = {
    "eval",
    "exec",
    "pickle.load",
    "pickle.loads",
    "pickle.Unpickler",
    "marshal.load",
    "marshal.loads",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "yaml.load_all",
}


def test_src_uses_no_deserialiser_that_can_run_code():
    bad = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names]
                module = getattr(node, "module", None) or ""
                if {"pickle", "marshal", "dill", "shelve"} & {module, *names} or (
                    module.startswith("torch") and "load" in names
                ):  # a bare load() would hide torch.load from the test above
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {names}")
        for call in calls(tree):
            name = dotted(call.func)
            allow_pickle = any(
                k.arg == "allow_pickle"
                and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in call.keywords
            )
            if name in UNSAFE or allow_pickle:
                bad.append(f"{path.relative_to(ROOT)}:{call.lineno} calls {name or 'allow_pickle'}")
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("with_checksum", [False, True], ids=["plain", "checksum-matches"])
def test_load_tensors_refuses_a_pickle_that_runs_code(tmp_path, with_checksum):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    # A tensor file that is also a hostile pickle; a matching sha256 proves identity, not safety.
    torch.save({"images": torch.zeros(2), "payload": Payload(marker)}, path)
    expected = sha256_file(path) if with_checksum else None
    with pytest.raises(CorruptFileError, match=r"evil\.pt cannot be read"):
        load_tensors(path, expected_sha256=expected)
    assert not marker.exists()


def test_load_tensors_still_reads_plain_tensor_files(tmp_path):
    digest = save_tensors(tmp_path / "ok.pt", {"x": torch.arange(3), "names": ["a", "b"]})
    loaded = load_tensors(tmp_path / "ok.pt", expected_sha256=digest)
    assert torch.equal(loaded["x"], torch.arange(3)) and loaded["names"] == ["a", "b"]


# --- 2. archives never write outside their folder ------------------------------------------------


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def tar_gz(path: Path, members: list[tarfile.TarInfo], data: bytes = b"payload\n") -> Path:
    """A tar.gz of ``members`` (regular ones hold ``data``), written as given, unsanitised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def hostile_members(outside: Path) -> dict[str, list[tarfile.TarInfo]]:
    """Archives whose last member(s) escape; a harmless file comes first, so a half-done
    extraction would show."""
    first = member("data/ok.txt")
    return {
        "absolute": [first, member(str(outside / "evil.txt"))],
        "dotdot": [first, member("data/../../outside/evil.txt")],
        "symlink-out-then-write": [
            first,
            member("data/out", tarfile.SYMTYPE, "../../outside"),
            member("data/out/evil.txt"),
        ],
        "symlink-absolute": [first, member("data/out", tarfile.SYMTYPE, str(outside))],
        "symlink-chain": [
            first,
            member("here", tarfile.SYMTYPE, "."),  # harmless on its own ...
            member("data/out", tarfile.SYMTYPE, "../here/../outside"),  # ... but not textually
        ],
        "hardlink-out": [first, member("data/secret", tarfile.LNKTYPE, "../outside/secret.txt")],
        "hardlink-absolute": [
            first,
            member("data/secret", tarfile.LNKTYPE, str(outside / "secret.txt")),
        ],
        "fifo": [first, member("data/pipe", tarfile.FIFOTYPE)],
        "char-device": [first, member("data/null", tarfile.CHRTYPE)],
    }


HOSTILE = list(hostile_members(Path("/x")))


@pytest.mark.parametrize("case", HOSTILE)
def test_extract_tar_refuses_members_that_escape_and_writes_nothing(tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    members = hostile_members(outside)[case]
    archive = tar_gz(tmp_path / "downloads" / "evil.tar.gz", members)
    target = tmp_path / "raw"
    before = files_under(tmp_path)
    with pytest.raises(DownloadError) as err:
        extract_tar(archive, target, name="cifar10")
    message = str(err.value)
    assert "refusing to extract" in message and str(archive) in message
    assert repr(members[-1].name) in message or repr(members[-2].name) in message
    assert "data.sources.cifar10.mirror" in message
    assert not archive.exists()  # deleted: its MD5 matched, so a rerun would unpack it again
    assert files_under(target) == {}
    assert files_under(tmp_path) == {p: v for p, v in before.items() if p != archive} | {
        target: None
    }


def test_extract_tar_unpacks_links_that_stay_inside(tmp_path):
    archive = tar_gz(
        tmp_path / "ok.tar.gz",
        [
            member("data/file.txt"),
            member("data/alias", tarfile.SYMTYPE, "file.txt"),
            member("data/hard", tarfile.LNKTYPE, "data/file.txt"),
            member("top", tarfile.SYMTYPE, "data"),
        ],
    )
    extract_tar(archive, tmp_path / "raw", name="cifar10")
    raw = tmp_path / "raw"
    assert (raw / "data/alias").read_bytes() == (raw / "data/hard").read_bytes() == b"payload\n"
    assert (raw / "top/file.txt").read_bytes() == b"payload\n"
    assert archive.exists()


def test_extract_tar_does_not_write_through_a_link_already_on_disk(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "raw"
    target.mkdir()
    (target / "data").symlink_to(outside)  # left by an earlier, hostile extraction
    archive = tar_gz(tmp_path / "ok.tar.gz", [member("data/evil.txt")])
    with pytest.raises(DownloadError, match=r"'data/evil.txt' would be written outside"):
        extract_tar(archive, target, name="cifar10")
    assert files_under(outside) == {}


def test_cifar_refuses_an_archive_that_escapes_even_when_its_md5_matches(
    server, tmp_path, monkeypatch
):
    """A mirror that also controls the checksum (or an MD5 collision) gets no further."""
    base = datasets.CIFAR10.base_folder
    archive = tar_gz(
        tmp_path / "build" / datasets.CIFAR10.filename,
        [member(f"{base}/data_batch_1"), member(f"{base}/../../escape.txt")],
    )
    server.serve(archive.name, archive.read_bytes())
    monkeypatch.setattr(datasets.CIFAR10, "tgz_md5", md5(archive.read_bytes()))
    root = tmp_path / "raw" / "cifar10"
    settings = dataset_settings("cifar10", {"mirror": server.url})
    with pytest.raises(DownloadError, match=r"member 'cifar-10-batches-py/../../escape.txt'"):
        DATASETS.get("cifar10").load(settings, root, seed=0)
    assert not (tmp_path / "raw" / "escape.txt").exists()
    assert files_under(root) == {}  # neither the archive nor any member is left


# --- 3. downloads are checked before use --------------------------------------------------------

GOOD = b"the official bytes\n" * 100
BAD = b"the official bytes\n" * 99 + b"something else ...\n"


def test_a_download_with_the_wrong_md5_is_deleted_and_explained(server, tmp_path):
    url = server.serve("file.bin", BAD)
    dest = tmp_path / "raw" / "file.bin"
    with pytest.raises(DownloadError) as err:
        download([url], dest, md5(GOOD), name="svhn")
    message = str(err.value)
    for part in ("file.bin", url, f"expected {md5(GOOD)}", f"MD5 is {md5(BAD)}", "corrupted"):
        assert part in message
    assert "data.sources.svhn.mirror" in message and "download it again" in message
    assert "deleted" in message and "nothing was written" in message
    assert files_under(dest.parent) == {}  # neither the file nor a temporary copy


def test_a_transfer_that_breaks_off_leaves_nothing(tmp_path):
    """The server promises more bytes than it sends, then hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n" + GOOD[:100])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/file.bin"
    dest = tmp_path / "raw" / "file.bin"
    try:
        with pytest.raises(DownloadError, match=f"MD5 is {md5(GOOD[:100])}, expected {md5(GOOD)}"):
            download([url], dest, md5(GOOD), name="svhn")
    finally:
        thread.join(timeout=10)
        listener.close()
    assert files_under(dest.parent) == {}


def test_a_file_on_disk_with_the_wrong_md5_is_fetched_again(server, tmp_path):
    url = server.serve("file.bin", GOOD)
    dest = tmp_path / "raw" / "file.bin"
    dest.parent.mkdir()
    dest.write_bytes(BAD)
    assert download([url], dest, md5(GOOD), name="svhn") == dest
    assert dest.read_bytes() == GOOD and server.requests == ["/file.bin"]
    # Verified now: used as it is, not fetched again.
    download([url], dest, md5(GOOD), name="svhn")
    assert server.requests == ["/file.bin"]


def test_a_file_on_disk_with_the_wrong_md5_is_not_kept_when_the_server_is_wrong_too(
    server, tmp_path
):
    url = server.serve("file.bin", BAD)
    dest = tmp_path / "raw" / "file.bin"
    dest.parent.mkdir()
    dest.write_bytes(BAD)
    with pytest.raises(DownloadError, match=f"MD5 is {md5(BAD)}, expected {md5(GOOD)}"):
        download([url], dest, md5(GOOD), name="svhn")
    assert files_under(dest.parent) == {}


def test_svhn_tampered_download_names_both_checksums_and_is_not_kept(server, tmp_path, monkeypatch):
    official, fname, _ = datasets.SVHN.split_list["train"]
    server.serve(fname, BAD)
    split_list = {**datasets.SVHN.split_list, "train": [official, fname, md5(GOOD)]}
    monkeypatch.setattr(datasets.SVHN, "split_list", split_list)
    root = tmp_path / "raw" / "svhn"
    with pytest.raises(DownloadError) as err:
        DATASETS.get("svhn").load(dataset_settings("svhn", {"mirror": server.url}), root, 0)
    assert f"MD5 is {md5(BAD)}, expected {md5(GOOD)}" in str(err.value)
    assert f"{server.url}/{fname}" in str(err.value)
    assert not (root / fname).exists()


def cifar10_archive(tmp: Path, monkeypatch) -> bytes:
    """A real-format CIFAR-10 archive of a few images; torchvision's MD5s patched to match."""
    tv = datasets.CIFAR10
    batches = {}
    for name in [*(b for b, _ in tv.train_list), *(b for b, _ in tv.test_list)]:
        data = RNG.integers(0, 256, size=(2, 3072), dtype=np.uint8)
        batches[name] = pickle.dumps({"data": data, "labels": [0, 1], "batch_label": name})
    batches[tv.meta["filename"]] = pickle.dumps({"label_names": [f"c{i}" for i in range(10)]})
    path = tmp / "build" / tv.filename
    path.parent.mkdir(parents=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in batches.items():
            info = tarfile.TarInfo(f"{tv.base_folder}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(tv, "tgz_md5", md5(path.read_bytes()))
    monkeypatch.setattr(tv, "train_list", [[b, md5(batches[b])] for b, _ in tv.train_list])
    monkeypatch.setattr(tv, "test_list", [[b, md5(batches[b])] for b, _ in tv.test_list])
    monkeypatch.setattr(tv, "meta", {**tv.meta, "md5": md5(batches[tv.meta["filename"]])})
    return path.read_bytes()


def test_a_tampered_cifar_batch_on_disk_is_never_unpickled(server, tmp_path, monkeypatch):
    server.serve(datasets.CIFAR10.filename, cifar10_archive(tmp_path, monkeypatch))
    settings = dataset_settings("cifar10", {"mirror": server.url})
    root = tmp_path / "raw" / "cifar10"
    first = DATASETS.get("cifar10").load(settings, root, seed=0)
    # Someone swaps an extracted batch (a pickle) for one that runs code when unpickled.
    marker = tmp_path / "pwned"
    batch = root / datasets.CIFAR10.base_folder / "data_batch_1"
    batch.write_bytes(pickle.dumps(Payload(marker)))
    again = DATASETS.get("cifar10").load(settings, root, seed=0)
    assert not marker.exists()
    assert torch.equal(again.train_images, first.train_images)  # unpacked again from the archive
    assert server.requests == [f"/{datasets.CIFAR10.filename}"]  # whose MD5 still matched


def test_a_tampered_mnist_file_on_disk_is_unpacked_again(server, tmp_path, monkeypatch):
    arrays = {
        "train-images-idx3-ubyte.gz": RNG.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": np.array([1, 2, 3], dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": RNG.integers(0, 256, (2, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": np.array([4, 5], dtype=np.uint8),
    }
    files = {}
    for name, a in arrays.items():
        header = (0x0800 | a.ndim).to_bytes(4, "big") + b"".join(
            n.to_bytes(4, "big") for n in a.shape
        )
        files[name] = gzip.compress(header + a.tobytes(), mtime=0)
        server.serve(name, files[name])
    monkeypatch.setattr(datasets.MNIST, "resources", [(n, md5(d)) for n, d in files.items()])
    settings = dataset_settings("mnist", {"mirror": server.url, "image_size": 28})
    root = tmp_path / "raw" / "mnist"
    assert DATASETS.get("mnist").load(settings, root, seed=0).train_labels.tolist() == [1, 2, 3]
    # The unpacked labels have no recorded checksum: someone relabels them on disk.
    labels = root / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-3] + bytes([9, 9, 9]))
    assert DATASETS.get("mnist").load(settings, root, seed=0).train_labels.tolist() == [1, 2, 3]


# --- 4. configuration values are data, never code ------------------------------------------------


def cli_validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gradinv.cli", "validate", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def tagged(marker: Path) -> dict[str, str]:
    """YAML tags that PyYAML's unsafe loaders turn into calls that create ``marker``."""
    return {
        "os.system": f"!!python/object/apply:os.system ['touch {marker}']",
        "subprocess": f"!!python/object/apply:subprocess.call [[touch, {marker}]]",
        "exec": f"!!python/object/apply:exec [\"open('{marker}', 'w').close()\"]",
        "new-popen": f"!!python/object/new:subprocess.Popen [[touch, {marker}]]",
        "name-only": "!!python/name:os.system",
    }


@pytest.mark.parametrize("tag", ["os.system", "subprocess", "exec", "new-popen", "name-only"])
def test_yaml_python_tags_are_refused_and_never_run(tmp_path, tag):
    marker = tmp_path / "pwned"
    value = tagged(marker)[tag]
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(PARAMS).replace("\nseed: 0\n", f"\nseed: {value}\n", 1))
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"attacks:\n  ig:\n    lr: {value}\n")
    refusal = r", line \d+, column \d+: the tag !!python/.* asks for a Python object"
    with pytest.raises(ConfigError, match=r"params\.yaml" + refusal):
        load_config(params)
    with pytest.raises(ConfigError, match=r"overlay\.yaml" + refusal):
        load_config(ROOT / "params.yaml", (overlay,))
    assert not marker.exists()


def test_cli_validate_refuses_python_tags_with_exit_2(tmp_path):
    marker = tmp_path / "pwned"
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"seed: {tagged(marker)['os.system']}\n")
    proc = cli_validate("--params", "params.yaml", "--configfile", str(overlay))
    assert proc.returncode == 2, proc.stderr
    assert "configuration error" in proc.stderr and "the tag !!python/" in proc.stderr
    assert not marker.exists()


CODE_STRINGS = {
    "seed": "__import__('os').system('touch {marker}')",
    "attacks.ig.lr": "__import__('pathlib').Path('{marker}').touch() or 0.1",
    "defenses.noise.std": "eval(\"open('{marker}', 'w').close()\") or 0.01",
}


def with_value(path: str, value: object) -> dict:
    cfg = copy.deepcopy(PARAMS)
    *parents, last = path.split(".")
    node = cfg
    for key in parents:
        node = node[key]
    node[last] = value
    return cfg


@pytest.mark.parametrize("key", list(CODE_STRINGS))
def test_a_code_string_in_a_numeric_field_is_a_type_error(tmp_path, key):
    marker = tmp_path / "pwned"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(with_value(key, CODE_STRINGS[key].format(marker=marker))))
    pattern = rf"\n  {re.escape(key)}: [\"'](__import__|eval)\(.* has the wrong type; expected"
    with pytest.raises(ConfigError, match=pattern):
        load_config(params)
    assert not marker.exists()


def test_cli_validate_refuses_a_code_string_with_exit_2(tmp_path, capsys):
    marker = tmp_path / "pwned"
    params = tmp_path / "params.yaml"
    code = f"__import__('os').system('touch {marker}')"
    params.write_text(yaml.safe_dump(with_value("seed", code)))
    # In process (the subprocess test above covers the entry point): loading the registries for
    # the full schema takes seconds in a fresh interpreter.
    assert cli_main(["validate", "--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and "seed: " in err
    assert "has the wrong type; expected integer" in err
    assert not marker.exists()
