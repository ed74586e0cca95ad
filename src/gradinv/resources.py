"""Running out of a resource (memory, disk, GPUs): a clear message, and one GPU per job.

:func:`explain_failure` turns the errors of an exhausted resource into one paragraph that names
the reason and the fix; the CLI prints it and exits with :data:`RESOURCE_EXIT_CODE` instead of a
traceback. Every message starts with ``out of memory:``, ``disk full:`` or ``GPUs busy:``, so a
log can be grepped for them.

:func:`acquire_device` gives each job a GPU of its own. Snakemake's local scheduler only counts
``gpu`` resource tokens and never sets ``CUDA_VISIBLE_DEVICES``, so without it every job would
run on ``cuda:0``. A job takes an exclusive ``flock`` on one lock file per GPU; the kernel drops
the lock when the file is closed, also when the process is killed, so a crashed job never leaves
a GPU taken. Lock files are named after the GPU's UUID rather than its index: under a scheduler
that sets ``CUDA_VISIBLE_DEVICES`` (SLURM), two jobs that both see their own GPU as ``cuda:0``
must not wait for each other, and one physical GPU must be one lock whatever index it has.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gradinv.config import project_root
from gradinv.settings import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_GPU_TIMEOUT_S",
    "RESOURCE_EXIT_CODE",
    "GpuBusyError",
    "acquire_device",
    "default_lock_dir",
    "explain_failure",
    "synchronize",
]

log = logging.getLogger(__name__)

# EX_TEMPFAIL of sysexits.h ("temporary failure; the user is invited to retry"): the job did
# nothing wrong and reruns as it is once memory, disk or a GPU is free. Distinct from 1 (a crash)
# and 2 (a configuration error, see gradinv.cli.main).
RESOURCE_EXIT_CODE = 75

DEFAULT_GPU_TIMEOUT_S = 3600.0
DEVICES = ("cpu", "cuda", "auto")
_ENV_LOCK_DIR = "GRADINV_LOCK_DIR"

_RERUN = "then rerun the same command: finished jobs are kept"
# torch.save to a path writes through C++ streams and loses errno: a full disk surfaces as one of
# these RuntimeErrors (measured with torch 2.14 writing to /dev/full).
_TORCH_WRITE_FAILED = re.compile(
    r"basic_ios::clear|unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing|"
    r"file write failed"
)
_DISK_ERRNOS = {errno.ENOSPC: "no space left on the device"}
if hasattr(errno, "EDQUOT"):
    _DISK_ERRNOS[errno.EDQUOT] = "quota exceeded"
_OOM = re.compile(r"out of memory|can't allocate memory|_ALLOC_FAILED", re.IGNORECASE)
_GPU_WORDS = re.compile(r"cuda|gpu|cublas|cudnn|\bhip\b|\bmps\b|\bxpu\b", re.IGNORECASE)


class GpuBusyError(RuntimeError):
    """Every visible GPU stayed taken by other jobs for the whole wait."""


# ----------------------------------------------------------------------------------------------
# Explaining failures


def explain_failure(exc: BaseException) -> str | None:
    """One paragraph naming the exhausted resource and the fix, or None for any other error.

    The exception's cause and context are searched too: torch and the stages often wrap the
    error that says what happened.
    """
    for err in _chain(exc):
        message = _explain_one(err)
        if message is not None:
            return message
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 32:
        err = todo.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        todo += [e for e in (err.__cause__, err.__context__) if e is not None]


def _explain_one(err: BaseException) -> str | None:
    if isinstance(err, GpuBusyError):
        return str(err)
    if isinstance(err, MemoryError):
        return _out_of_memory(err, gpu=False)
    torch = sys.modules.get("torch")  # a torch error can only exist once torch is imported
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(err, oom_type):
        return _out_of_memory(err, gpu=True)
    if isinstance(err, OSError) and err.errno in _DISK_ERRNOS:
        filename = err.filename if err.filename is not None else err.filename2
        return _disk_full(err, _DISK_ERRNOS[err.errno], filename)
    if isinstance(err, RuntimeError):
        text = str(err)
        if _OOM.search(text):
            return _out_of_memory(err, gpu=bool(_GPU_WORDS.search(text)))
        if _TORCH_WRITE_FAILED.search(text):
            return _disk_full(err, "torch could not finish writing a file", None, guessed=True)
    return None


def _out_of_memory(err: BaseException, *, gpu: bool) -> str:
    if gpu:
        return (
            f"out of memory: the job ran out of GPU memory ({_short(err)}). Lower the batch "
            "size or the attack batch in params.yaml, make sure no two jobs share a GPU (run "
            "Snakemake with --resources gpu=N, N the number of GPUs), or use a GPU with more "
            f"memory; {_RERUN}."
        )
    return (
        f"out of memory: the job ran out of CPU memory (RAM) ({_short(err)}). Lower the batch "
        "size or the attack batch in params.yaml, or run fewer jobs at once: a smaller N in "
        "snakemake --cores N, or --resources mem_mb=<the machine's memory in MB> so that jobs "
        f"declaring mem_mb never exceed it together; {_RERUN}."
    )


def _disk_full(
    err: BaseException,
    reason: str,
    filename: str | os.PathLike[str] | bytes | None,
    *,
    guessed: bool = False,
) -> str:
    if isinstance(filename, bytes):
        filename = os.fsdecode(filename)
    where = f" while writing {filename}" if filename is not None else ""
    place = Path(filename) if filename is not None else project_root()
    free = _free_space(place)
    space = f" {free}." if free else " The free space of that filesystem could not be read."
    if guessed:
        lead = (
            f"disk full: {reason} ({_short(err)}); torch reports a full disk or an exceeded "
            "quota this way when it writes to a path."
        )
    else:
        lead = f"disk full: {reason}{where} ({_short(err)})."
    return (
        f"{lead}{space} Free some space (or raise the quota), {_RERUN} and this job's partial "
        "output was never renamed into place."
    )


def _free_space(path: Path) -> str | None:
    """``'<free> free of <total> on the filesystem of <folder>'``, or None if unreadable."""
    for folder in (path, *path.parents):
        try:
            usage = shutil.disk_usage(folder)
        except OSError:
            continue
        return f"{_bytes(usage.free)} free of {_bytes(usage.total)} on the filesystem of {folder}"
    return None


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# ----------------------------------------------------------------------------------------------
# One GPU per job


def default_lock_dir() -> Path:
    """``$GRADINV_LOCK_DIR`` if set, else ``<project root>/.snakemake/gradinv-locks``."""
    env = os.environ.get(_ENV_LOCK_DIR)
    return Path(env) if env else project_root() / ".snakemake" / "gradinv-locks"


def scheduled_gpu_job() -> str | None:
    """The id of the SLURM job this process runs in, when SLURM gave it GPUs; else None.

    SLURM makes only a job's own GPUs visible (``CUDA_VISIBLE_DEVICES``), so on a cluster the
    first visible GPU is the job's, and the per-GPU file locks (a one-machine mechanism, for jobs
    that share all of a machine's GPUs) are not taken.
    """
    job = os.environ.get("SLURM_JOB_ID")
    gpus = any(
        os.environ.get(v) for v in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE")
    )
    return job if job and gpus and os.environ.get("CUDA_VISIBLE_DEVICES") else None


@contextlib.contextmanager
def acquire_device(
    requested: str,
    lock_dir: Path | None = None,
    *,
    timeout_s: float = DEFAULT_GPU_TIMEOUT_S,
    poll_s: float = 1.0,
) -> Iterator[torch.device]:
    """Yield the device to run on; for CUDA, a GPU no other job holds until this one exits.

    ``requested`` is the ``device`` setting: ``cpu``, ``cuda`` or ``auto`` (CUDA when a GPU is
    visible, else CPU). CPU takes no lock. In a SLURM job given GPUs the first visible one is
    the job's (:func:`scheduled_gpu_job`). Otherwise, for CUDA the first free visible GPU is
    locked and made the current device; when all are taken this waits up to ``timeout_s``
    seconds, polling every ``poll_s``, then raises :class:`GpuBusyError`.
    """
    import torch

    if requested not in DEVICES:
        raise ConfigError(f"device: {requested!r} is not one of {', '.join(DEVICES)}")
    if requested == "cpu":
        _say_device(torch.device("cpu"))
        yield torch.device("cpu")
        return
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not has_gpu:
        if requested == "auto":
            _say_device(torch.device("cpu"), "device: auto, no GPU visible")
            yield torch.device("cpu")
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        note = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise ConfigError(
            f"device: cuda is set, but this process sees no CUDA GPU{note}. Set device: cpu, "
            "or device: auto to use a GPU only when one is visible, in params.yaml or a "
            "--configfile overlay."
        )
    job = scheduled_gpu_job()
    if job is not None:  # the scheduler chose the GPU: the visible ones are this job's alone
        torch.cuda.set_device(0)
        _say_device(torch.device("cuda", 0), f"{_gpu_name(torch, 0)}; given to SLURM job {job}")
        yield torch.device("cuda", 0)
        return
    lock_dir = Path(lock_dir) if lock_dir is not None else default_lock_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    index, fd = _claim_gpu(torch, lock_dir, timeout_s, poll_s)
    try:
        # Also the default for code that says plain "cuda" or .cuda(): it must not reach cuda:0.
        torch.cuda.set_device(index)
        _say_device(torch.device("cuda", index), _gpu_name(torch, index))
        yield torch.device("cuda", index)
    finally:
        _release(fd)


def _say_device(device: torch.device, note: str = "") -> None:
    """One line in the job's log: where it ran (``make gpu-check`` reads it)."""
    print(f"gradinv: device {device}" + (f" ({note})" if note else ""), file=sys.stderr, flush=True)


def _gpu_name(torch_mod, index: int) -> str:
    try:
        return torch_mod.cuda.get_device_name(index)
    except (AttributeError, RuntimeError):  # a driver that cannot say; the index suffices
        return ""


def _claim_gpu(torch_mod, lock_dir: Path, timeout_s: float, poll_s: float) -> tuple[int, int]:
    count = torch_mod.cuda.device_count()
    paths = [
        lock_dir / f"gpu-{torch_mod.cuda.get_device_properties(i).uuid}.lock" for i in range(count)
    ]
    start = time.monotonic()
    waiting = False
    while True:
        for index, path in enumerate(paths):
            fd = _try_lock(path)
            if fd is not None:
                os.ftruncate(fd, 0)
                holder = f"pid {os.getpid()} on {socket.gethostname()} as cuda:{index}"
                os.pwrite(fd, f"{holder} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
                if waiting:
                    log.info("got cuda:%d after %.0f s", index, time.monotonic() - start)
                return index, fd
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise GpuBusyError(
                f"GPUs busy: all {count} visible GPUs stayed taken by other jobs for {waited:.0f} "
                f"s ({_holders(paths)}; lock files in {lock_dir}). Each job takes a GPU of its "
                f"own: run Snakemake with --resources gpu={count} (the number of GPUs) so that it "
                f"never starts more GPU jobs than there are GPUs; {_RERUN}."
            )
        if not waiting:
            waiting = True
            log.warning(
                "all %d GPUs are taken (%s); waiting up to %.0f s for one. Snakemake's "
                "--resources gpu=N should equal the number of GPUs.",
                count,
                _holders(paths),
                timeout_s,
            )
        time.sleep(min(poll_s, max(timeout_s - waited, 0.0)))


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding the exclusive lock on ``path``, or None if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _release(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)  # the holder note is only true while the lock is held
    finally:
        os.close(fd)  # closing the last descriptor drops the flock


def _holders(paths: list[Path]) -> str:
    notes = []
    for path in paths:
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        notes.append(text.split(" since ")[0] if text else f"{path.name}: holder unknown")
    return "; ".join(notes)


def synchronize(device: torch.device) -> None:
    """Wait for the queued GPU work, so that a wall time measures the work, not its launch."""
    if device.type == "cuda":
        import torch  # on use: importing it costs seconds

        torch.cuda.synchronize(device)
