"""``python benchmarks/costs.py --measure-iterations``: time every per-iteration unit.

Each unit the paper overlay's jobs use (the keys of :func:`full_scale.job_plan`'s terms): an
attack iteration as benchmarks/restarts.py times it, a client update, a generator forward and
forward plus backward at batch 1. Writes them, with the device and the machine's load average
around each, to results/benchmarks/iterations.json (the "--measure-iterations" paragraph of
costs.py's docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from full_scale import job_plan  # beside this script, in benchmarks/
from jobs import Dag

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS_FILE = Path("results/benchmarks/iterations.json")


def timed(fn: Callable[[], object], repeats: int, device: Any, slow: float) -> tuple[float, int]:
    """Median seconds of ``fn`` after an untimed warm-up (timing.median_seconds, except that a
    call slower than ``slow`` seconds is timed once): (seconds, calls timed)."""
    import torch

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    warm = once()
    n = 1 if warm > slow else repeats
    return statistics.median(once() for _ in range(n)), n


def measure_unit(key: str, device: Any, iterations: int, repeats: int, slow: float) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from restarts import photo, run_ig

    from gradinv.defenses import build_defense, gradients_of
    from gradinv.fl.client import client_update
    from gradinv.models import build_model
    from gradinv.protocol import ModelSpec, PublicMeta, ServerMessage, SharedUpdate, normalize

    u = json.loads(key)
    out = {"key": key, **u}
    if u["kind"].startswith("generator"):
        from gradinv.generators import GENERATORS
        from gradinv.settings import from_mapping

        cls = GENERATORS.get(u["generator"])
        gen = cls.build(from_mapping(cls.Settings, u["settings"], where="benchmark")).to(device)
        z = torch.randn(1, *gen.latent_shape, device=device)
        labels = torch.tensor([1], device=device) if gen.num_classes else None
        if u["kind"] == "generator_forward":

            def fn() -> object:
                with torch.no_grad():
                    return gen(z, labels)
        else:
            z.requires_grad_(True)

            def fn() -> object:
                gen(z, labels).sum().backward()
                return None

        seconds, n = timed(fn, repeats, device, slow)
        return out | {"seconds": seconds, "timed_calls": n, "num_blocks": gen.num_blocks}
    channels, size, _ = u["shape"]
    spec = ModelSpec(u["model"], u["classes"], channels, size, u["model_settings"])
    batch = u["batch"]
    images = torch.cat([photo(size).roll(7 * i, dims=-1) for i in range(batch)])
    images = images[:, :channels] if channels <= 3 else images
    labels = torch.arange(batch) % u["classes"]
    mean, std = (0.5,) * channels, (0.25,) * channels
    if u["kind"] == "client_step":
        model = build_model(spec, seed=0).to(device).train()
        defense = build_defense("none", {}, where="benchmark")
        inputs, targets = normalize(images, mean, std).to(device), labels.to(device)

        def step() -> object:
            return client_update(
                model,
                inputs,
                targets,
                defense,
                protocol="fedsgd",
                local_steps=1,
                local_lr=0.0,
                generator=torch.Generator().manual_seed(0),
            )

        seconds, n = timed(step, repeats, device, slow)
        return out | {"seconds": seconds, "timed_calls": n}
    # one IG iteration, 1 restart, as benchmarks/restarts.py times it (the attack's loop timer)
    model = build_model(spec, seed=0).eval()
    grads = gradients_of(model, normalize(images, mean, std), labels, F.cross_entropy)
    meta = PublicMeta(
        "benchmark",
        batch,
        (channels, size, size),
        u["classes"],
        mean,
        std,
        "eval",
        "none",
        "none",
        {},
        labels=tuple(labels.tolist()),
    )
    update = SharedUpdate({k: v.detach() for k, v in grads.items()}, "gradient", meta)
    server = ServerMessage(spec, model.state_dict(), 0)
    run_ig(server, update, device, 2, 1, "sequential")  # warm-up
    per_it = []
    for _ in range(repeats):  # restarts.seconds_per_iteration, but a slow run is timed once
        attack, _ = run_ig(server, update, device, iterations, 1, "sequential")
        per_it.append(attack.speed["seconds"] / attack.speed["iterations"])
        if attack.speed["seconds"] > slow:
            break
    return out | {
        "seconds": statistics.median(per_it),
        "iterations": iterations,
        "timed_calls": len(per_it),
    }


def measure_iterations(dag: Dag, config: dict, a: argparse.Namespace) -> dict[str, Any]:
    """Time every per-iteration unit the full-scale jobs need; write iterations.json."""
    import torch

    from gradinv.io import write_json

    torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    keys = sorted(
        {key for j in dag.jobs if j.output for _, key in job_plan(config, j).terms},
        key=lambda k: (json.loads(k)["kind"], k),
    )
    iterations = a.iterations or (50 if device.type == "cuda" else 5)
    units = []
    for i, key in enumerate(keys):
        start, load = time.perf_counter(), os.getloadavg()[0]
        u = measure_unit(key, device, iterations, a.repeats, a.slow)
        units.append(u | {"load_average": [load, os.getloadavg()[0]]})
        what = {k: v for k, v in u.items() if k not in ("key", "seconds", "kind")}
        print(
            f"[{i + 1}/{len(keys)}] {u['kind']}: {u['seconds']:.4g} s "
            f"({time.perf_counter() - start:.0f} s to measure) {json.dumps(what)}",
            file=sys.stderr,
        )
    name = torch.cuda.get_device_name() if device.type == "cuda" else cpu_name()
    report = {
        "device": device.type,
        "device_name": name,
        "threads": a.threads,
        "torch": torch.__version__,
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "configs": ["params.yaml", a.paper_config],
        "units": units,
    }
    write_json(ROOT / ITERATIONS_FILE, report)
    return report


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
