"""Resource exhaustion: the messages, one GPU per job (CUDA simulated), atomic writes on a full disk."""

import errno
import logging
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import gradinv.io
from gradinv import resources
from gradinv.resources import GpuBusyError, acquire_device, explain_failure
from gradinv.settings import ConfigError

# fork: the children inherit the simulated GPUs that monkeypatch set up in the test.
MP = multiprocessing.get_context("fork")


# ----------------------------------------------------------------------------------------------
# explain_failure


@pytest.mark.parametrize(
    ("err", "where"),
    [
        (MemoryError(), "CPU"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)"), "GPU"),
        (torch.cuda.OutOfMemoryError("CUDA out of memory."), "GPU"),
        (RuntimeError("CUDA error: out of memory"), "GPU"),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes"
            ),
            "CPU",
        ),
    ],
)
def test_out_of_memory_names_the_memory_and_the_fix(err, where):
    message = explain_failure(err)
    assert message is not None
    assert message.startswith("out of memory:")
    assert f"{where} memory" in message
    assert "batch size" in message
    fixes = ["--cores N", "mem_mb"] if where == "CPU" else ["--resources gpu=N", "more memory"]
    assert all(fix in message for fix in fixes)


def test_disk_full_names_the_file_and_its_free_space(tmp_path):
    target = tmp_path / "results" / "x.pt"  # the folder need not exist: its parent is measured
    message = explain_failure(OSError(errno.ENOSPC, "No space left on device", str(target)))
    assert message is not None
    assert message.startswith("disk full: no space left")
    assert f"while writing {target} (" in message
    assert "free of" in message and f"on the filesystem of {tmp_path}" in message
    assert "rerun the same command" in message and "never renamed into place" in message


def test_quota_exceeded_is_disk_full():
    message = explain_failure(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert message is not None and message.startswith("disk full: quota exceeded")


def test_disk_full_is_found_behind_a_wrapping_error():
    # torch.save into a Python file object raises RuntimeError('unexpected pos ...') with the
    # OSError as its context; a stage may also wrap it with `raise ... from err`.
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise ValueError("could not save the reconstruction") from inner
    except ValueError as outer:
        message = explain_failure(outer)
    assert message is not None and message.startswith("disk full:")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_torch_save_to_a_full_disk_is_disk_full():
    # A real full disk: torch.save to a path loses errno and raises an opaque RuntimeError.
    with pytest.raises(RuntimeError) as info:
        torch.save({"x": torch.zeros(1 << 16)}, "/dev/full")
    message = explain_failure(info.value)
    assert message is not None and message.startswith("disk full:")


@pytest.mark.parametrize(
    "err",
    [
        ValueError("bad value"),
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"),
        OSError(errno.ENOENT, "No such file or directory", "x.pt"),
        PermissionError(errno.EACCES, "Permission denied", "x.pt"),
        KeyboardInterrupt(),
        ConfigError("attacks.ig.lr: must be > 0"),
    ],
)
def test_other_errors_are_not_explained(err):
    assert explain_failure(err) is None


# ----------------------------------------------------------------------------------------------
# Atomic writes hit by a full disk


def _enospc():
    return OSError(errno.ENOSPC, "No space left on device")


def test_save_tensors_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    def save_half(obj, f):  # the disk fills up halfway through the file
        f.write(b"PK\x03\x04 partial")
        f.flush()
        raise _enospc()

    monkeypatch.setattr(torch, "save", save_half)  # what save_tensors calls
    with pytest.raises(OSError) as info:
        gradinv.io.save_tensors(tmp_path / "out" / "capture.pt", {"x": torch.zeros(3)})
    assert list((tmp_path / "out").iterdir()) == []
    assert explain_failure(info.value).startswith("disk full:")


@pytest.mark.parametrize("existing", [None, '{"old": 1}\n'])
def test_write_json_on_a_full_disk_leaves_nothing_new(tmp_path, monkeypatch, existing):
    target = tmp_path / "metrics.json"
    if existing is not None:
        target.write_text(existing)
    real_write_text = Path.write_text

    def write_half(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise _enospc()

    monkeypatch.setattr(Path, "write_text", write_half)
    with pytest.raises(OSError) as info:
        gradinv.io.write_json(target, {"psnr": 12.5, "ssim": 0.3})
    monkeypatch.undo()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "mlflow.db")
    assert left == ([] if existing is None else ["metrics.json"])
    if existing is not None:
        assert target.read_text() == existing
    assert explain_failure(info.value).startswith("disk full:")


# ----------------------------------------------------------------------------------------------
# acquire_device, with simulated GPUs


def _simulate_gpus(monkeypatch, count: int) -> list[int]:
    """Make torch see ``count`` GPUs; returns the list that records set_device calls."""
    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(uuid=f"{i:08x}-0000-4000-8000-000000000000"),
    )
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


def _hold(lock_dir, reports, release):
    """Child process: hold a GPU until ``release`` is set."""
    with acquire_device("cuda", lock_dir, timeout_s=10, poll_s=0.02) as device:
        reports.put((os.getpid(), str(device)))
        release.wait(20)


def _start_holder(lock_dir, reports):
    release = MP.Event()
    proc = MP.Process(target=_hold, args=(lock_dir, reports, release), daemon=True)
    proc.start()
    pid, device = reports.get(timeout=10)
    assert pid == proc.pid
    return proc, release, device


def _stop(*holders):
    for _, release, _ in holders:
        release.set()
    for proc, _, _ in holders:
        proc.join(10)
        assert proc.exitcode == 0


def test_two_jobs_get_different_gpus(tmp_path, monkeypatch):
    _simulate_gpus(monkeypatch, 2)
    lock_dir, reports = tmp_path / "locks", MP.Queue()
    a = _start_holder(lock_dir, reports)
    b = _start_holder(lock_dir, reports)
    try:
        assert {a[2], b[2]} == {"cuda:0", "cuda:1"}
        notes = [p.read_text() for p in sorted(lock_dir.glob("gpu-*.lock"))]
        # Each lock file says who holds it, for a human looking at a stuck run.
        assert sorted(n.split()[1] for n in notes) == sorted(str(p.pid) for p, _, _ in (a, b))
    finally:
        _stop(a, b)
    assert [p.read_text() for p in lock_dir.glob("gpu-*.lock")] == ["", ""]


def test_nested_holders_in_one_process_get_different_gpus(tmp_path, monkeypatch):
    current = _simulate_gpus(monkeypatch, 2)
    with (
        acquire_device("auto", tmp_path) as first,
        acquire_device("cuda", tmp_path) as second,
    ):
        assert {str(first), str(second)} == {"cuda:0", "cuda:1"}
        assert current == [first.index, second.index]  # plain "cuda" means the job's GPU


def test_a_third_job_waits_for_a_free_gpu(tmp_path, monkeypatch, caplog):
    _simulate_gpus(monkeypatch, 2)
    lock_dir, reports = tmp_path / "locks", MP.Queue()
    a = _start_holder(lock_dir, reports)
    b = _start_holder(lock_dir, reports)
    try:
        threading.Timer(0.6, a[1].set).start()  # job a finishes while the third one waits
        start = time.monotonic()
        with (
            caplog.at_level(logging.WARNING, logger="gradinv.resources"),
            acquire_device("cuda", lock_dir, timeout_s=10, poll_s=0.05) as device,
        ):
            waited = time.monotonic() - start
            assert str(device) == a[2]
        assert waited >= 0.5
        waits = [r for r in caplog.records if "waiting" in r.getMessage()]
        assert len(waits) == 1, "the wait is logged once, not once per poll"
        assert "--resources gpu=N" in waits[0].getMessage()
    finally:
        _stop(a, b)


def test_all_gpus_busy_times_out_with_the_fix(tmp_path, monkeypatch):
    _simulate_gpus(monkeypatch, 2)
    lock_dir, reports = tmp_path / "locks", MP.Queue()
    a = _start_holder(lock_dir, reports)
    b = _start_holder(lock_dir, reports)
    try:
        start = time.monotonic()
        with (
            pytest.raises(GpuBusyError, match=r"all 2 visible GPUs.*--resources gpu=2") as info,
            acquire_device("cuda", lock_dir, timeout_s=0.3, poll_s=0.05),
        ):
            pass
        assert 0.3 <= time.monotonic() - start < 5
        assert f"pid {a[0].pid}" in str(info.value)  # names who holds them
        assert explain_failure(info.value).startswith("GPUs busy:")
    finally:
        _stop(a, b)


def test_a_killed_job_frees_its_gpu(tmp_path, monkeypatch):
    _simulate_gpus(monkeypatch, 1)
    lock_dir, reports = tmp_path / "locks", MP.Queue()
    proc, _, device = _start_holder(lock_dir, reports)
    assert device == "cuda:0"
    with pytest.raises(GpuBusyError), acquire_device("cuda", lock_dir, timeout_s=0):
        pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    with acquire_device("cuda", lock_dir, timeout_s=2, poll_s=0.05) as device:
        assert str(device) == "cuda:0"


@pytest.mark.parametrize(("requested", "gpus"), [("cpu", 2), ("auto", 0)])
def test_cpu_takes_no_lock(tmp_path, monkeypatch, requested, gpus):
    current = _simulate_gpus(monkeypatch, gpus)
    if requested == "cpu":  # cpu must not even ask about GPUs
        monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("asked for GPUs"))
    with acquire_device(requested, tmp_path / "locks") as device:
        assert device == torch.device("cpu")
    assert not (tmp_path / "locks").exists()
    assert current == []


def test_cuda_without_a_gpu_names_the_key_and_the_fix(tmp_path, monkeypatch):
    _simulate_gpus(monkeypatch, 0)
    with (
        pytest.raises(ConfigError, match=r"device: cuda.*device: cpu.*device: auto"),
        acquire_device("cuda", tmp_path),
    ):
        pass


def test_an_unknown_device_is_a_config_error(tmp_path):
    with (
        pytest.raises(ConfigError, match=r"device: 'gpu' is not one of cpu, cuda, auto"),
        acquire_device("gpu", tmp_path),
    ):
        pass


def test_default_lock_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADINV_LOCK_DIR", raising=False)
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    assert resources.default_lock_dir() == tmp_path / ".snakemake" / "gradinv-locks"
    monkeypatch.setenv("GRADINV_LOCK_DIR", str(tmp_path / "elsewhere"))
    assert resources.default_lock_dir() == tmp_path / "elsewhere"


def test_a_slurm_job_uses_the_gpu_slurm_gave_it_without_locks(tmp_path, monkeypatch):
    """On a cluster the scheduler places GPU jobs: a SLURM job given a GPU sees only its own
    (CUDA_VISIBLE_DEVICES) and runs on the first visible one; no lock file is written."""
    current = _simulate_gpus(monkeypatch, 2)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with acquire_device("cuda", tmp_path / "locks") as device:
        assert str(device) == "cuda:0"
    assert current == [0] and not (tmp_path / "locks").exists()
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")  # a SLURM job without GPUs: the usual locks
    with acquire_device("cuda", tmp_path / "locks", timeout_s=5) as device:
        assert list((tmp_path / "locks").glob("gpu-*.lock"))
