"""What the benchmark scripts share: the median wall time of a call, synchronized on a GPU."""

from __future__ import annotations

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
