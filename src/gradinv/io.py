"""Atomic, verifiable file writes and safe reads.

Every output of the pipeline is written to a temporary file in the same folder and renamed into
place, so an interrupted job never leaves a half-written file that looks finished. Tensor files are
read with ``weights_only=True``: a file from elsewhere cannot run code when it is loaded.

Tensor files verify themselves: :func:`save_tensors` stores the payload with a sha256 of its
content (every tensor's dtype, shape and bytes, every other value's JSON), and
:func:`load_tensors` recomputes it. A truncated file fails to unpickle, an altered one fails the
digest; both raise :class:`CorruptFileError` naming the file and the command that regenerates it.

JSON result files (metrics, partitions, training summaries, manifests) verify themselves the same
way and stay plain, readable JSON: :func:`write_json` adds one top-level field,
``content_sha256``, the sha256 of the canonical JSON of every other field (keys sorted, no
whitespace), and :func:`read_json` recomputes it and returns the object without it. An edited
value, or a file written before this check existed (or by hand), carries no matching digest and is
refused, so no table is rendered from a number nobody computed.

The command that regenerates a file repeats the options the pipeline was started with (its
``--configfile`` overlays, its profile): the Snakefile exports them to every job as
``GRADINV_SNAKEMAKE_OPTIONS`` (:func:`snakemake_command`). Without them, the hint would rebuild
the file at the default scale, and the next run under the overlay would redo it.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class CorruptFileError(RuntimeError):
    """A file failed its checksum or structural check."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        stale.unlink(missing_ok=True)  # left by a writer that was killed (SIGKILL) mid-write
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


#: The top-level field of a JSON result file that holds the sha256 of the rest.
JSON_DIGEST = "content_sha256"
#: What the Snakefile exports to every job: the shell-quoted options that select what is computed.
SNAKEMAKE_OPTIONS = "GRADINV_SNAKEMAKE_OPTIONS"


def write_json(path: str | os.PathLike[str], obj: dict[str, Any]) -> None:
    """Write the JSON object ``obj`` atomically, with the digest :func:`read_json` checks."""
    if not isinstance(obj, dict):
        raise TypeError(f"a JSON result file holds an object; got {type(obj).__name__}")
    if JSON_DIGEST in obj:
        raise ValueError(f"{JSON_DIGEST!r} is the file's own field")
    stamped = {**obj, JSON_DIGEST: json_digest(obj)}
    write_text(path, json.dumps(stamped, indent=2, sort_keys=True, allow_nan=True) + "\n")


def read_json(path: str | os.PathLike[str], remedy: str = "") -> dict[str, Any]:
    """Read a file written by :func:`write_json`, without its digest field.

    A missing, truncated, garbled, altered or unstamped file raises :class:`CorruptFileError`
    (:class:`FileNotFoundError` if missing) naming it and ``remedy``, the command that
    regenerates it (by default, Snakemake's for its path).
    """
    hint = regenerate_hint(path, remedy)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)  # accepts NaN / Infinity, which failed runs may contain
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist.{hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorruptFileError(f"{path}: not valid JSON ({err}).{hint}") from None
    if not isinstance(data, dict) or not isinstance(data.get(JSON_DIGEST), str):
        raise CorruptFileError(
            f"{path} carries no {JSON_DIGEST}, so nothing vouches for its values: it was "
            f"written by hand or before result files were checksummed.{hint}"
        )
    stored = data.pop(JSON_DIGEST)
    if json_digest(data) != stored:
        raise CorruptFileError(
            f"{path} is corrupted: its content does not match the sha256 stored with it "
            f"(a value was changed after it was written).{hint}"
        )
    return data


def json_digest(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` as a reader gets it back (tuples as lists, keys
    as strings), with sorted keys and no whitespace, so indentation does not count."""
    as_read = json.loads(json.dumps(obj, allow_nan=True))
    text = json.dumps(as_read, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def snakemake_command(target: str | os.PathLike[str]) -> str:
    """``snakemake <target> --cores 1`` with the options the running pipeline was started with
    (``GRADINV_SNAKEMAKE_OPTIONS``, already shell-quoted; none outside Snakemake)."""
    command = f"snakemake {_shell_word(target)} --cores 1"
    options = os.environ.get(SNAKEMAKE_OPTIONS, "").strip()
    return f"{command} {options}" if options else command


def regenerate_hint(path: str | os.PathLike[str], remedy: str = "") -> str:
    """The sentence every corrupted-file message ends with: by default, Snakemake's command."""
    remedy = remedy or f"rm -f {_shell_word(path)} && {snakemake_command(path)}"
    return f" Regenerate it with: {remedy}"


def _shell_word(path: str | os.PathLike[str]) -> str:
    """``path`` quoted for the shell where it needs it (a space); a placeholder such as
    ``data/evalnet/<dataset>.pt``, to be filled in before it runs, is left readable."""
    text = str(path)
    return text if re.fullmatch(r"[\w@%+=:,./<>-]+", text) else shlex.quote(text)


FORMAT = "gradinv-tensors/1"


def save_tensors(path: str | os.PathLike[str], obj: Any) -> str:
    """Save ``obj`` (tensors, numbers, strings, lists and dicts of them); return the file's sha256.

    The file holds ``obj`` with a digest of its content, checked by :func:`load_tensors`.
    """
    import torch  # here, not above: the workflow's job graph reads JSON helpers of this module

    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:  # through a file object, a full disk keeps its errno
            torch.save({"format": FORMAT, "sha256": content_digest(obj), "payload": obj}, f)
        digest = sha256_file(tmp)
    return digest


def load_tensors(
    path: str | os.PathLike[str], expected_sha256: str | None = None, remedy: str = ""
) -> Any:
    """Load a file written by :func:`save_tensors` and verify its content digest.

    ``expected_sha256`` (the whole file's, e.g. from a manifest) is checked too when given.
    ``remedy`` is the command that regenerates the file; by default, Snakemake's for its path.
    """
    path = Path(path)
    hint = regenerate_hint(path, remedy)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist.{hint}")
    if expected_sha256 is not None:
        actual = sha256_file(path)
        if actual != expected_sha256:
            raise CorruptFileError(
                f"{path} is corrupted: sha256 {actual[:12]}... differs from the recorded "
                f"{expected_sha256[:12]}....{hint}"
            )
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CorruptFileError(f"{path} cannot be read ({err}).{hint}") from err
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or "payload" not in saved:
        raise CorruptFileError(f"{path} is not a gradinv tensor file ({FORMAT}).{hint}")
    if content_digest(saved["payload"]) != saved.get("sha256"):
        raise CorruptFileError(
            f"{path} is corrupted: its content does not match the sha256 stored with it.{hint}"
        )
    return saved["payload"]


def content_digest(obj: Any) -> str:
    """sha256 of a nested structure of tensors and JSON values (independent of pickling)."""
    h = hashlib.sha256()
    _digest_into(h, obj)
    return h.hexdigest()


def _digest_into(h: Any, obj: Any) -> None:
    torch = sys.modules.get("torch")  # not loaded: nothing here is a tensor
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for key in obj:  # insertion order: saved and loaded dicts keep it
            h.update(json.dumps(str(key)).encode())
            _digest_into(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for item in obj:
            _digest_into(h, item)
    else:
        h.update(json.dumps(obj, allow_nan=True, default=repr).encode())


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """A stable hash of a JSON-able object (used for config hashes)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
