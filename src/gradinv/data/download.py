"""Shared plumbing of the download-backed datasets (torchvision's CIFAR, MNIST, SVHN).

torchvision fetches each archive and checks it against the MD5 it records for that file; we keep
that check, verify the files again with ``check_integrity`` before reading them, and turn any
failure into a :class:`DownloadError` that names the URL and the fix. ``mirror`` replaces only the
base URL: the file names and checksums stay torchvision's, so a mirror serving a different file
fails loudly instead of silently changing the data.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.error import URLError

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets.utils import check_integrity

from gradinv.data.base import DatasetSource, DownloadError, RawSplits, resize_images, subsample
from gradinv.settings import bounded

# torchvision's urlopen has no timeout: a silent server would hang the pipeline forever.
SOCKET_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DownloadSettings:
    image_size: int = bounded(32, ge=8, doc="side after bilinear resizing (native: 32, MNIST 28)")
    mirror: str = ""  # base URL replacing the official one; checksums are unchanged
    train_limit: int = bounded(0, ge=0, doc="seeded subset of the train split; 0 keeps all")
    val_limit: int = bounded(0, ge=0, doc="seeded subset of the test split; 0 keeps all")


def mirror_url(official: str, mirror: str) -> str:
    """``official`` with its base replaced by ``mirror`` (file name kept); unchanged if empty."""
    if not mirror:
        return official
    return f"{mirror.rstrip('/')}/{official.rsplit('/', 1)[-1]}"


@contextlib.contextmanager
def socket_timeout(seconds: float) -> Iterator[None]:
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(old)


def fetch(make: Callable[[], Any], *, name: str, urls: list[str], root: Path) -> Any:
    """Run a torchvision constructor with ``download=True``; explain any failure."""
    try:
        with socket_timeout(SOCKET_TIMEOUT_S):
            return make()
    except (RuntimeError, URLError, OSError) as err:
        why = (
            " The file's MD5 differs from torchvision's recorded checksum: the server sent a "
            "different or truncated file."
            if "corrupted" in str(err)
            else " The server could not be reached or refused the request."
        )
        raise DownloadError(
            f"{name}: could not download or verify {', '.join(urls)} into {root}: "
            f"{str(err).strip()}.{why} Check data.{name}.mirror in params.yaml (empty = the "
            f"official URL), delete {root} and rerun, or put the verified files there by hand."
        ) from err


def verify(name: str, files: list[tuple[Path, str]]) -> None:
    """Check each ``(path, md5)`` before use, even when torchvision found the files already."""
    for path, md5 in files:
        if not check_integrity(path, md5):
            raise DownloadError(
                f"{name}: {path} is missing or fails its MD5 check ({md5}); delete "
                f"it and rerun to download it again."
            )


class TorchvisionSource(DatasetSource):
    """A torchvision dataset; subclasses implement :meth:`fetch_splits`."""

    kind = "download"
    Settings = DownloadSettings
    name: ClassVar[str]

    @classmethod
    def fetch_splits(
        cls, settings: DownloadSettings, root: Path
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[str, ...], str]:
        """Return (train images NCHW uint8, labels, test images, labels, classes, URL)."""
        raise NotImplementedError

    @classmethod
    def load(cls, settings: DownloadSettings, root: Path, seed: int) -> RawSplits:
        root = Path(root)
        train_x, train_y, val_x, val_y, classes, url = cls.fetch_splits(settings, root)
        rng = np.random.default_rng(seed)
        keep_train = torch.from_numpy(subsample(len(train_y), settings.train_limit, rng))
        keep_val = torch.from_numpy(subsample(len(val_y), settings.val_limit, rng))
        return RawSplits(
            train_images=resize_images(train_x[keep_train], settings.image_size),
            train_labels=train_y[keep_train].to(torch.int64),
            val_images=resize_images(val_x[keep_val], settings.image_size),
            val_labels=val_y[keep_val].to(torch.int64),
            classes=classes,
            source=(
                f"{cls.paper_name} from {url} (MD5-verified by torchvision); official train "
                f"split as train, official test split as validation; "
                f"{settings.image_size}px"
            ),
        )
