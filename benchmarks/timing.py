"""What the benchmark scripts share: the median wall time of a call, synchronized on a GPU."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """The median over ``repeats`` calls of ``fn``, after one warm-up call; on a GPU each timing
    waits for the queued kernels, so it measures the work, not the launch."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def add_devices_argument(parser: argparse.ArgumentParser) -> None:
    """``--devices cpu cuda``: the devices a benchmark runs on (see :func:`available_devices`)."""
    parser.add_argument(
        "--devices",
        nargs="+",
        choices=["cpu", "cuda"],
        default=None,
        help="default: the CPU, and CUDA when present",
    )


def available_devices(names: list[str] | None = None) -> list[torch.device]:
    """The devices a benchmark runs on: ``names`` (``cpu``, ``cuda``) as asked, else the CPU and,
    when one is visible, the GPU. Asking for ``cuda`` without one is an error that says so."""
    if names is None:
        names = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in names and not torch.cuda.is_available():
        raise SystemExit(
            "--devices cuda: no CUDA device is visible (torch.cuda.is_available() is False); "
            "run on a machine with an NVIDIA GPU and a CUDA build of PyTorch, or leave cuda out"
        )
    return [torch.device(n) for n in dict.fromkeys(names)]
