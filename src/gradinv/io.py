"""Atomic, verifiable file writes and safe reads.

Every output of the pipeline is written to a temporary file in the same folder and renamed into
place, so an interrupted job never leaves a half-written file that looks finished. Tensor files are
read with ``weights_only=True``: a file from elsewhere cannot run code when it is loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


class CorruptFileError(RuntimeError):
    """A file failed its checksum or structural check."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600 files; give the result the permissions a plain open() would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as f:
        return json.load(f)


def save_tensors(path: str | os.PathLike[str], obj: Any) -> str:
    """Save ``obj`` (tensors, numbers, strings, lists and dicts of them); return its sha256."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
        digest = sha256_file(tmp)
    return digest


def load_tensors(
    path: str | os.PathLike[str], expected_sha256: str | None = None, remedy: str = ""
) -> Any:
    """Load a file written by :func:`save_tensors`, verifying its sha256 when one is given."""
    path = Path(path)
    hint = f" Regenerate it with: {remedy}" if remedy else " Delete it and rerun the pipeline."
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist.{hint}")
    if expected_sha256 is not None:
        actual = sha256_file(path)
        if actual != expected_sha256:
            raise CorruptFileError(
                f"{path} is corrupted: sha256 {actual[:12]}... differs from the recorded "
                f"{expected_sha256[:12]}....{hint}"
            )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CorruptFileError(f"{path} cannot be read ({err}).{hint}") from err


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """A stable hash of a JSON-able object (used for config hashes)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
