"""Shared plumbing of the download-backed datasets (torchvision's CIFAR, MNIST, SVHN).

Files, URLs and MD5s are torchvision's; fetching, checking and unpacking are done here, because
each of them is a place where a hostile or broken server could reach us:

- :func:`download` writes to a temporary file and renames it into place only once its MD5 matches
  the recorded one, so a wrong file never sits where a later run would find it; a file already on
  disk is checked too and fetched again when it fails. Failures raise :class:`DownloadError`
  naming the file, the URL, the expected and actual MD5 and the fix.
- :func:`extract_tar` checks every member before writing anything and refuses absolute paths,
  ``..`` components, links that leave the folder, devices and FIFOs. torchvision's own extraction
  is a plain ``extractall``, which on Python < 3.14 writes wherever a member points.
- torchvision's classes are then built with ``download=False``: they only read, and they check
  the MD5 of each file before unpickling it (CIFAR's batches are pickles).

``mirror`` replaces only the base URL: the file names and checksums stay torchvision's, so a mirror
serving a different file fails loudly instead of silently changing the data.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import ClassVar
from urllib.error import URLError

import numpy as np
import torch
from torch import Tensor

from gradinv.data.base import DatasetSource, DownloadError, RawSplits, resize_images, subsample
from gradinv.io import atomic_path
from gradinv.settings import bounded

# urlopen's default is no timeout: a silent server would hang the pipeline forever.
SOCKET_TIMEOUT_S = 60.0
# The agent torchvision sends; some dataset hosts refuse urllib's default one.
USER_AGENT = "pytorch/vision"


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


def md5_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fix(name: str, dest: Path, md5: str) -> str:
    return (
        f"Check that data.sources.{name}.mirror in params.yaml (empty = the official URL) "
        f"serves the official file and rerun to download it again, or put the verified file at "
        f"{dest} by hand (MD5 {md5})."
    )


def download(urls: list[str], dest: Path, md5: str, *, name: str) -> Path:
    """Make ``dest`` a file with MD5 ``md5``, fetched from the first of ``urls`` that serves one.

    A file already at ``dest`` is used only if its MD5 matches; otherwise it is deleted and fetched
    again. A download is written beside ``dest`` and renamed onto it only after its MD5 matched,
    so a wrong or truncated file is never left where a later run would find it.
    """
    dest = Path(dest)
    failures = []
    if dest.is_file():
        found = md5_file(dest)
        if found == md5:
            return dest
        dest.unlink()  # never trusted; fetched again below
        failures.append(f"{dest} was already there with MD5 {found}, expected {md5}; deleted")
    for url in urls:
        print(f"{name}: downloading {url} to {dest}", file=sys.stderr)
        try:
            with atomic_path(dest) as tmp:
                request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
                response = urllib.request.urlopen(request, timeout=SOCKET_TIMEOUT_S)
                with response, open(tmp, "wb") as f:
                    shutil.copyfileobj(response, f)
                actual = md5_file(tmp)
                if actual != md5:
                    # Raised inside atomic_path: the temporary file is deleted, dest untouched.
                    raise DownloadError(
                        f"{url} sent a corrupted {dest.name}: its MD5 is {actual}, expected "
                        f"{md5} (torchvision's recorded checksum). The server sent a different "
                        f"or truncated file; it was deleted"
                    )
            return dest
        except DownloadError as err:
            failures.append(str(err))
        except (URLError, OSError, HTTPException) as err:
            failures.append(
                f"{url} could not be downloaded ({type(err).__name__}: {err}): the server could "
                f"not be reached, refused the request or broke off the transfer"
            )
    raise DownloadError(
        f"{name}: no verified copy of {dest.name} could be downloaded into {dest.parent}; "
        f"nothing was written there:\n  " + "\n  ".join(failures) + f"\n{_fix(name, dest, md5)}"
    )


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _refusal(member: tarfile.TarInfo, target: str, links: set[PurePosixPath]) -> str | None:
    """Why ``member`` must not be extracted into ``target`` (a real path), or None if it may.

    ``links`` holds the (normalised) names of the archive's earlier link members: nothing may be
    written through them, so each path can be checked from its text alone, plus the links that
    already exist on disk (``realpath``).
    """
    name = member.name
    if name.startswith(("/", "\\")) or PureWindowsPath(name).drive or os.path.isabs(name):
        return "has an absolute path"
    path = PurePosixPath(name)
    if ".." in path.parts:
        return "has a '..' component"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return "is a device, FIFO or other special file"
    if any(parent in links for parent in path.parents):
        return "lies under a link of the same archive"
    if not _inside(target, os.path.realpath(os.path.join(target, name))):
        return f"would be written outside {target} (through a link already there)"
    if member.issym() or member.islnk():
        link = member.linkname
        kind = "symlink" if member.issym() else "hard link"
        if link.startswith(("/", "\\")) or PureWindowsPath(link).drive or os.path.isabs(link):
            return f"is a {kind} to the absolute path {link!r}"
        base = path.parent if member.issym() else PurePosixPath()  # hard links: from the root
        # Walked step by step: "here/../x", with "here" a link, leaves the folder although its
        # text normalises to "x".
        resolved = PurePosixPath()
        for part in (base / link).parts:
            if resolved in links:
                return f"is a {kind} to {link!r}, through another link of the same archive"
            resolved = PurePosixPath(os.path.normpath(resolved / part))
            if resolved.parts[:1] == ("..",):
                return f"is a {kind} to {link!r}, outside the folder"
        if not _inside(target, os.path.realpath(os.path.join(target, resolved))):
            return f"is a {kind} to {link!r}, which leads outside {target}"
        links.add(PurePosixPath(os.path.normpath(name)))
    return None


def extract_tar(archive: Path, target: Path, *, name: str) -> None:
    """Unpack ``archive`` into ``target``, refusing it whole if any member could land outside.

    Every member is checked before anything is written; a refused archive is deleted, since its
    MD5 matched and a later run would otherwise unpack it again. Where ``tarfile`` has the
    ``data`` filter (Python 3.12, backported to 3.8.17+/3.11.4+) it is applied as well.
    """
    archive, target = Path(archive), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    real = os.path.realpath(target)
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            links: set[PurePosixPath] = set()
            for member in members:
                why = _refusal(member, real, links)
                if why is not None:
                    archive.unlink()
                    raise DownloadError(
                        f"{name}: refusing to extract {archive}: its member {member.name!r} "
                        f"{why}. Nothing was extracted and the archive was deleted; it is not "
                        f"the official file. Check data.sources.{name}.mirror in params.yaml "
                        f"(empty = the official URL) and rerun to download it again."
                    )
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, members=members, filter="data")
            else:
                tar.extractall(target, members=members)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DownloadError(
            f"{name}: {archive} cannot be extracted into {target} ({err}). Delete {archive} "
            f"and rerun to download it again."
        ) from err


def gunzip(src: Path, dest: Path) -> None:
    """Decompress ``src`` to ``dest`` atomically (``src`` is MD5-verified by the caller)."""
    with atomic_path(dest) as tmp, gzip.open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout)


def verify(name: str, files: list[tuple[Path, str]]) -> None:
    """Check each ``(path, md5)`` before use; a failing file is deleted, never read."""
    for path, md5 in files:
        actual = md5_file(path) if path.is_file() else "missing"
        if actual != md5:
            path.unlink(missing_ok=True)
            raise DownloadError(
                f"{name}: {path} fails its MD5 check (expected {md5}, found {actual}); it was "
                f"deleted. Rerun to download and extract it again, or check "
                f"data.sources.{name}.mirror in params.yaml (empty = the official URL)."
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
                f"{cls.paper_name} from {url} (MD5-verified against torchvision's checksums); "
                f"official train split as train, official test split as validation; "
                f"{settings.image_size}px"
            ),
        )
