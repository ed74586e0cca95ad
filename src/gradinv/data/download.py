"""Shared plumbing of the download-backed datasets (torchvision's CIFAR, MNIST, SVHN).

Files, URLs and MD5s are torchvision's, byte sizes are recorded by each loader; fetching,
checking and unpacking are done here, because each of them is a place where a hostile or broken
server could reach us:

- :func:`download` streams into a temporary file beside the destination, hashing as it writes,
  and renames it into place only once its MD5 matches the recorded one, so a wrong, truncated or
  half-written file never sits where a later run would find it; a file already on disk is checked
  too and fetched again when it fails. Each transfer is bounded:

  * in bytes, by the file's known size: a Content-Length that disagrees with it is refused before
    the body is read, a body that grows past it is refused at the first byte too many, a shorter
    one at its end. A loader that knows no size (torchvision changed the file) falls back to the
    server's Content-Length, and without one to :data:`UNKNOWN_SIZE_LIMIT`;
  * in time, by an overall deadline (:func:`deadline_for`: :data:`DEADLINE_BASE_S` plus the
    expected bytes at :data:`MIN_BYTES_PER_S`, 33 minutes for CIFAR-10's 170 MB). A socket
    timeout alone bounds each read, so a server sending a byte every few seconds would hold a job
    forever; the transfer runs in a worker thread and is abandoned at the deadline, whatever
    phase it is in (connecting, headers, body).

  Every refusal raises :class:`DownloadError` with a one-line message naming the URL, the file,
  what was wrong and the fix (a mirror, or placing the verified file by hand); ``gradinv <verb>``
  prints it as one line and exits with code 3.
- :func:`extract_tar` checks every member before writing anything and refuses absolute paths,
  ``..`` components, links that leave the folder, devices and FIFOs. torchvision's own extraction
  is a plain ``extractall``, which on Python < 3.14 writes wherever a member points.
- torchvision's classes are then built with ``download=False``: they only read, and they check
  the MD5 of each file before unpickling it (CIFAR's batches are pickles).

``mirror`` replaces only the base URL: the file names, sizes and checksums stay the official
ones, so a mirror serving a different file fails loudly instead of silently changing the data.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import queue
import shutil
import sys
import tarfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPException
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import ClassVar, cast
from urllib.error import URLError

import numpy as np
import torch
from torch import Tensor

from gradinv.data.base import DatasetSource, DownloadError, RawSplits, resize_images, subsample
from gradinv.io import atomic_path
from gradinv.settings import bounded

# urlopen's default is no timeout: a silent server would hang the pipeline forever. This bounds
# each wait for the server (connecting, one read); the deadline below bounds the whole transfer.
SOCKET_TIMEOUT_S = 60.0
# The overall deadline of one transfer: a fixed allowance (connection, redirects, a slow start)
# plus the expected bytes at a slow link's throughput (100 kB/s, under 1 Mbit/s). CIFAR-10's
# 170 MB get 33 minutes, SVHN's train split 35; a mirror slower than that is better replaced.
DEADLINE_BASE_S = 300.0
MIN_BYTES_PER_S = 100_000
# The byte limit of a file whose size is unknown and whose server sends no Content-Length: above
# any file these datasets have (the largest, SVHN's unused extra split, is 1.3 GB).
UNKNOWN_SIZE_LIMIT = 2 << 30
# The most one read returns; a read returns as soon as any bytes arrived, so the deadline and
# the byte limit are checked after every packet a trickling server sends.
CHUNK_BYTES = 1 << 20
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


def deadline_for(size: int | None) -> float:
    """Seconds one transfer of a ``size``-byte file may take; a file of unknown size (None) is
    given the time of :data:`UNKNOWN_SIZE_LIMIT` bytes, about 6 hours."""
    return DEADLINE_BASE_S + (UNKNOWN_SIZE_LIMIT if size is None else size) / MIN_BYTES_PER_S


def _fix(name: str, dest: Path, md5: str, size: int | None) -> str:
    bytes_ = "" if size is None else f", {size} bytes"
    return (
        f"Fix: set data.sources.{name}.mirror in params.yaml (empty = the official URL) to a "
        f"server that has the official file and rerun to download it again, or put the verified "
        f"file at {dest} by hand (MD5 {md5}{bytes_})."
    )


class _DeadlinePassed(Exception):
    """The transfer's deadline passed while waiting for the worker (never leaves this module)."""


class _Transfer:
    """One HTTP GET in a worker thread, so that the caller can give up at its deadline whatever
    the server does: a read blocked on a stalled or trickling server cannot hold the caller.

    The worker hands over the response's headers, waits until the caller accepts them
    (:meth:`accept`: nothing of the body is read before), then the body in chunks and ``b""`` at
    its end; an exception that stops it is handed over instead. A stopped worker ends after its
    current read, which the socket timeout bounds.
    """

    def __init__(self, url: str, socket_timeout: float) -> None:
        self._items: queue.Queue[Message | bytes | Exception] = queue.Queue(maxsize=8)
        self._accepted = threading.Event()
        self._stopped = threading.Event()
        worker = threading.Thread(target=self._run, args=(url, socket_timeout), daemon=True)
        worker.start()

    def _run(self, url: str, socket_timeout: float) -> None:
        try:
            request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
            with urllib.request.urlopen(request, timeout=socket_timeout) as response:
                self._put(response.headers)
                self._accepted.wait()
                while not self._stopped.is_set():
                    chunk = response.read1(CHUNK_BYTES)  # whatever arrived, not a full chunk
                    self._put(chunk)
                    if not chunk:
                        return
        except Exception as err:  # handed to the caller, which reports it
            self._put(err)

    def _put(self, item: Message | bytes | Exception) -> None:
        while not self._stopped.is_set():  # the queue is bounded: wait, unless stopped
            try:
                self._items.put(item, timeout=0.1)
                return
            except queue.Full:
                pass

    def headers(self, end: float) -> Message:
        """The response's headers (the worker's first item), waiting until ``end`` at most."""
        return cast(Message, self._next(end))

    def chunk(self, end: float) -> bytes:
        """The body's next bytes, ``b""`` at its end, waiting until ``end`` at most."""
        return cast(bytes, self._next(end))

    def _next(self, end: float) -> Message | bytes:
        """The next item, waiting until the monotonic time ``end`` at most."""
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise _DeadlinePassed
        try:
            item = self._items.get(timeout=remaining)
        except queue.Empty:
            raise _DeadlinePassed from None
        if isinstance(item, Exception):
            raise item
        return item

    def accept(self) -> None:
        self._accepted.set()

    def stop(self) -> None:
        self._stopped.set()
        self._accepted.set()


def _fetch(url: str, tmp: Path, dest: Path, size: int | None, deadline_s: float) -> str:
    """Stream ``url`` into ``tmp`` within the limits described in the module docstring; return
    the MD5 of what was written. Raises :class:`DownloadError` for a refusal, and the transfer's
    own error (URLError, OSError, HTTPException) when the server failed."""
    end = time.monotonic() + deadline_s
    transfer = _Transfer(url, min(SOCKET_TIMEOUT_S, deadline_s))
    received = 0
    try:
        announced = transfer.headers(end).get("Content-Length")
        if announced is not None and not announced.strip().isdigit():
            raise DownloadError(f"{url} sent an invalid Content-Length {announced!r}; refused")
        announced_size = None if announced is None else int(announced)
        if size is not None and announced_size is not None and announced_size != size:
            raise DownloadError(
                f"{url} announced {announced_size} bytes for {dest.name} (its Content-Length), "
                f"but the official file has {size}: it is not the official file; refused before "
                f"reading it"
            )
        expected = size if size is not None else announced_size
        limit = expected if expected is not None else UNKNOWN_SIZE_LIMIT
        transfer.accept()
        h = hashlib.md5(usedforsecurity=False)
        with open(tmp, "wb") as f:
            while chunk := transfer.chunk(end):
                received += len(chunk)
                if received > limit:
                    raise DownloadError(
                        f"{url} sent more than the {limit} bytes "
                        + ("" if expected is not None else "allowed for a file of unknown size ")
                        + f"of {dest.name}; refused at {received} bytes"
                    )
                h.update(chunk)
                f.write(chunk)
        # Of unknown size, a body shorter than its Content-Length is left to the MD5 check.
        if size is not None and received < size:
            raise DownloadError(
                f"{url} ended {dest.name} after {received} of its {size} bytes: the transfer "
                f"was cut short; refused"
            )
        return h.hexdigest()
    except _DeadlinePassed:
        of = "" if size is None else f" of {size}"
        raise DownloadError(
            f"{url} did not deliver {dest.name} within its {deadline_s:.1f} s deadline "
            f"({received}{of} bytes received): the server stalled or is too slow; abandoned"
        ) from None
    finally:
        transfer.stop()


def download(
    urls: list[str],
    dest: Path,
    md5: str,
    *,
    name: str,
    size: int | None = None,
    deadline_s: float | None = None,
) -> Path:
    """Make ``dest`` a file with MD5 ``md5``, fetched from the first of ``urls`` that serves one.

    ``size`` is the file's byte size where known (None: the server's Content-Length is the limit,
    or :data:`UNKNOWN_SIZE_LIMIT` without one); ``deadline_s`` bounds each URL's transfer
    (None: :func:`deadline_for` the size). A file already at ``dest`` is used only if its size and
    MD5 match; otherwise it is deleted and fetched again. A download is written beside ``dest``
    and renamed onto it only after its MD5 matched, so a refused, wrong or truncated file is never
    left where a later run would find it.
    """
    dest = Path(dest)
    deadline_s = deadline_for(size) if deadline_s is None else deadline_s
    failures = []
    if dest.is_file():
        found = dest.stat().st_size
        if size is not None and found != size:
            failures.append(
                f"{dest} was already there with {found} bytes, expected {size}; deleted"
            )
        elif (actual := md5_file(dest)) == md5:
            return dest
        else:
            failures.append(f"{dest} was already there with MD5 {actual}, expected {md5}; deleted")
        dest.unlink()  # never trusted; fetched again below
    for url in urls:
        print(f"{name}: downloading {url} to {dest}", file=sys.stderr)
        try:
            with atomic_path(dest) as tmp:
                actual = _fetch(url, tmp, dest, size, deadline_s)
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
    # One line: the command line prints it as the job's one error message.
    raise DownloadError(
        f"{name}: no verified copy of {dest.name} could be downloaded into {dest.parent}; "
        f"nothing was written there. "
        + "; ".join(failure.replace("\n", " ") for failure in failures)
        + f". {_fix(name, dest, md5, size)}"
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
