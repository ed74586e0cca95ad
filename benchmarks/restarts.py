"""Restarts of Inverting Gradients: R restarts in one vmap pass (batched) or in a loop (sequential)?

    python benchmarks/restarts.py [--models resnet18 cnn3] [--sizes 32 64] [--restarts 4]
        [--iterations N] [--repeats 3] [--check-iterations 60] [--threads T] [--processes]
        [--quick]

Speed: for each model (ResNet-18 with the small-image stem at each of ``--sizes``; the small
default-scale ``cnn3`` at 32x32 only), untrained (seed 0), eval mode, batch 1 (a photo,
scikit-image's cat resized, label known), on each available device (CPU, and CUDA when
present): the median seconds per IG iteration (the attack's own loop timer, ``attack.speed``,
after a warm-up run) of 1 restart (``sequential``: one plain autograd graph), R restarts
``batched`` (one ``torch.func.vmap`` pass) and R restarts ``sequential`` (a loop over them).
Ratios: R batched / 1 restart and R sequential / 1 restart (R: no saving; below R: the restarts
share work), and sequential / batched (the speedup of batching). Also the layout ``auto`` picks
for R restarts of that model on that device (:func:`gradinv.attacks.restarts.resolve_layout`)
and the faster one as measured. ``--iterations`` defaults to 5 on the CPU and 50 on CUDA.

Correctness: on ``cnn3`` with the photo at 16x16, per device, IG with 3 restarts, the same
seed, both layouts, ``signed`` True (the default) and False, for ``--check-iterations``
iterations. Reported: the largest absolute pixel difference of the two returned images, the
count of pixel values that differ by more than 1e-3, whether the best restart is the same, the
relative difference of the best gradient distances (and the largest over all restarts). Before
that, the image gradient of the cosine gradient distance at the same starting dummies in both
layouts (the quantity IG signs and steps on), as max |difference| / max |gradient|.

The pass criterion (exit code 1 when it fails), chosen by experiment: the layouts compute the
same function, but vmap's batched convolutions sum in a different order, so they agree only up
to float32 rounding. Measured on a 2-core CPU (PyTorch 2.14; two 16x16 photos, seeds 0-4, 60
iterations, 1 and 2 threads): the first-step image gradients differ by at most 2e-7 relative,
unsigned runs by at most 3.3e-7 in pixels and 1.4e-6 relative in gradient distances, and signed
runs are bit-identical (a rounding difference changes no sign). Longer runs drift further
(unsigned, 200 iterations: a non-best restart's distance 2% apart, the best one's image still
within 1e-6), hence 60 iterations. Not yet measured on CUDA, where the batched kernels may round
differently again. Required, on every device:

- first-step image gradient: max |difference| <= 1e-4 * max |gradient|;
- ``signed: false``: the same best restart, pixels within 1e-3, best distance within 1e-3
  relative (a rounding difference grows only slowly without the sign);
- ``signed: true``: the same best restart, best distance within 1e-2 relative, and at most 5%
  of the pixel values more than 1e-3 apart. The sign amplifies: where a pixel's gradient is
  near zero, rounding can flip its sign, and that pixel then moves by a whole Adam step
  (lr 0.1 in normalised units, 0.025 in pixels) the other way, so a few pixels may differ by
  up to a few 1e-2 although the math agrees. Wrong math would move nearly every pixel. The report
  labels each run ``identical``, ``rounding`` (pixels within 1e-3) or ``diverged``.

Processes (``--processes``, CPU only): IG with 1 restart on ResNet-18 32x32 in two spawned
one-thread processes at once against one spawned process with two threads: iterations per
second in total, and the ratio.

Writes results/benchmarks/restarts.json and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from skimage import data, transform
from timing import (
    add_devices_argument,
    available_devices,
)  # benchmarks/timing.py, beside this script

from gradinv.attacks import ThreatModel, build_attack
from gradinv.attacks.matching import cosine_distances
from gradinv.attacks.restarts import initial_dummies, resolve_layout, restart_gradients
from gradinv.defenses import gradients_of
from gradinv.models import build_model
from gradinv.protocol import ModelSpec, PublicMeta, ServerMessage, SharedUpdate, normalize
from gradinv.stages.common import full_float32

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
LABEL = 3
SEED = 0
CPU = torch.device("cpu")
# the correctness criterion (module docstring)
GRADIENT_TOL = 1e-4
PIXEL_TOL = 1e-3
DISTANCE_TOL = {False: 1e-3, True: 1e-2}  # by ``signed``
SIGNED_DIVERGED_FRACTION = 0.05


def spec_of(model_name: str, size: int) -> ModelSpec:
    settings = {"small_image_stem": True} if model_name == "resnet18" else {}
    return ModelSpec(model_name, 10, 3, size, settings)


def photo(size: int) -> torch.Tensor:
    """Scikit-image's cat, its central square resized to size x size: (1, 3, size, size)."""
    img = data.chelsea()
    h, w = img.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    img = transform.resize(
        img[top : top + side, left : left + side], (size, size), anti_aliasing=True
    )
    return torch.tensor(img, dtype=torch.float32).permute(2, 0, 1)[None]


def capture(model_name: str, size: int) -> tuple[ServerMessage, SharedUpdate]:
    """The server's message and the client's undefended gradient of one photo (label known)."""
    spec = spec_of(model_name, size)
    model = build_model(spec, seed=0).eval()
    images, labels = photo(size), torch.tensor([LABEL])
    grads = gradients_of(model, normalize(images, MEAN, STD), labels, F.cross_entropy)
    meta = PublicMeta(
        "benchmark",
        1,
        (3, size, size),
        10,
        MEAN,
        STD,
        "eval",
        "none",
        "none",
        {},
        labels=(LABEL,),
    )
    update = SharedUpdate({k: v.detach() for k, v in grads.items()}, "gradient", meta)
    return ServerMessage(spec, model.state_dict(), 0), update


def attack_of(iterations: int, restarts: int, layout: str, signed: bool = True):
    settings = {
        "iterations": iterations,
        "restarts": restarts,
        "restarts_layout": layout,
        "signed": signed,
        "log_every": iterations,  # no per-iteration history
    }
    return build_attack(
        "inverting_gradients", settings, ThreatModel(labels="known"), where="benchmark"
    )


def run_ig(server, update, device, iterations, restarts, layout, signed=True, seed=SEED):
    """One IG run, its progress bar and log line kept off the terminal: (attack, result)."""
    attack = attack_of(iterations, restarts, layout, signed)
    if device.type == "cuda":
        torch.cuda.synchronize()
    with contextlib.redirect_stderr(io.StringIO()):
        result = attack.reconstruct(
            server, update, torch.Generator().manual_seed(seed), device=device
        )
    if device.type == "cuda":
        torch.cuda.synchronize()
    return attack, result


def seconds_per_iteration(server, update, device, restarts, layout, iterations, repeats):
    """Median over ``repeats`` fresh runs of the attack loop's seconds per iteration."""
    run_ig(server, update, device, min(iterations, 3), restarts, layout)  # warm-up
    per_it = []
    for _ in range(repeats):
        attack, _ = run_ig(server, update, device, iterations, restarts, layout)
        per_it.append(attack.speed["seconds"] / attack.speed["iterations"])
    return statistics.median(per_it)


def speed(model_name, size, device, restarts, iterations, repeats) -> dict[str, object]:
    server, update = capture(model_name, size)

    def time(r: int, layout: str) -> float:
        return seconds_per_iteration(server, update, device, r, layout, iterations, repeats)

    one = time(1, "sequential")
    bat = time(restarts, "batched")
    seq = time(restarts, "sequential")
    model = build_model(spec_of(model_name, size), seed=0).eval()
    auto = resolve_layout("auto", model, device, restarts)
    faster = "batched" if bat < seq else "sequential"
    return {
        "model": model_name,
        "device": str(device),
        "image_size": size,
        "restarts": restarts,
        "iterations": iterations,
        "repeats": repeats,
        "one_restart_s_per_it": round(one, 5),
        "batched_s_per_it": round(bat, 5),
        "sequential_s_per_it": round(seq, 5),
        "one_restart_it_per_s": round(1 / one, 2),
        "batched_it_per_s": round(1 / bat, 2),
        "sequential_it_per_s": round(1 / seq, 2),
        "batched_over_one_restart": round(bat / one, 2),
        "sequential_over_one_restart": round(seq / one, 2),
        "batched_speedup_over_sequential": round(seq / bat, 2),
        "auto_picks": auto,
        "faster_measured": faster,
        "auto_is_faster": auto == faster,
    }


def image_gradient(server, update, device, restarts: int, layout: str) -> torch.Tensor:
    """The image gradient of the cosine gradient distance at the starting dummies of ``SEED``,
    with the parameter gradients in ``layout``: what IG signs (or not) and steps on first."""
    attack = attack_of(1, restarts, layout)
    model, named, target = attack.match_target(server, update, device)
    labels = attack.private_labels(model, update).to(device)

    def no_aux(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = F.cross_entropy(logits, labels)
        return loss, loss.new_zeros(())

    gradients = restart_gradients(model, named, no_aux, layout)
    shape = (1, *update.meta.image_shape)
    x = initial_dummies(restarts, shape, torch.Generator().manual_seed(SEED), device)
    x.requires_grad_(True)
    distance = cosine_distances(gradients(x, True)[0], target).sum()
    (grad,) = torch.autograd.grad(distance, x)
    return grad


def first_step_gradients(server, update, device, restarts: int) -> dict[str, object]:
    b = image_gradient(server, update, device, restarts, "batched")
    s = image_gradient(server, update, device, restarts, "sequential")
    rel = ((b - s).abs().max() / s.abs().max()).item()
    return {
        "image_gradient_rel_diff": rel,
        "sign_agreement": (b.sign() == s.sign()).float().mean().item(),
        "passed": rel <= GRADIENT_TOL,
    }


def layouts_agree(device, iterations: int, restarts: int, signed: bool) -> dict[str, object]:
    server, update = capture("cnn3", 16)
    out = {
        layout: run_ig(server, update, device, iterations, restarts, layout, signed)[1]
        for layout in ("batched", "sequential")
    }
    b, s = out["batched"], out["sequential"]
    diff = (b.images - s.images).abs()
    pixel = diff.max().item()
    apart = int((diff > PIXEL_TOL).sum())
    db, ds = b.summary["gradient_distance"], s.summary["gradient_distance"]
    rel = abs(db - ds) / max(abs(db), abs(ds), 1e-12)
    every = [
        abs(x - y) / max(abs(x), abs(y), 1e-12)
        for (_, x), (_, y) in zip(
            b.history["final_gradient_distance"],
            s.history["final_gradient_distance"],
            strict=True,
        )
    ]
    same = b.summary["best_restart"] == s.summary["best_restart"]
    layouts = (b.summary["restarts_layout"], s.summary["restarts_layout"])
    # signed: a few pixels may diverge by a flipped sign (module docstring); unsigned: none
    limit = SIGNED_DIVERGED_FRACTION * diff.numel() if signed else 0
    return {
        "device": str(device),
        "signed": signed,
        "restarts": restarts,
        "iterations": iterations,
        "layouts_run": list(layouts),
        "best_restart_batched": b.summary["best_restart"],
        "best_restart_sequential": s.summary["best_restart"],
        "same_best_restart": same,
        "max_pixel_diff": pixel,
        "pixel_values_apart": apart,
        "pixel_values": diff.numel(),
        "gradient_distance_batched": db,
        "gradient_distance_sequential": ds,
        "gradient_distance_rel_diff": rel,
        "all_restarts_distance_rel_diff_max": max(every),
        "verdict": "identical" if pixel == 0 else "rounding" if pixel <= PIXEL_TOL else "diverged",
        "passed": (
            layouts == ("batched", "sequential")
            and same
            and rel <= DISTANCE_TOL[signed]
            and apart <= limit
        ),
    }


def correctness(device, iterations: int, restarts: int = 3) -> dict[str, object]:
    server, update = capture("cnn3", 16)
    step = first_step_gradients(server, update, device, restarts)
    runs = [layouts_agree(device, iterations, restarts, signed) for signed in (True, False)]
    return {
        "device": str(device),
        "first_step": step,
        "runs": runs,
        "passed": step["passed"] and all(r["passed"] for r in runs),
    }


def process_worker(threads, iterations, repeats, barrier, queue) -> None:
    """One spawned process: IG, 1 restart, ResNet-18 32x32, ``threads`` threads; puts its median
    seconds per iteration. Runs start together with the other process's (``barrier``)."""
    torch.set_num_threads(threads)
    server, update = capture("resnet18", 32)
    run_ig(server, update, CPU, 2, 1, "sequential")  # warm-up
    per_it = []
    for _ in range(repeats):
        if barrier is not None:
            barrier.wait()
        attack, _ = run_ig(server, update, CPU, iterations, 1, "sequential")
        per_it.append(attack.speed["seconds"] / attack.speed["iterations"])
    queue.put(statistics.median(per_it))


def processes(iterations: int, repeats: int) -> dict[str, object]:
    ctx = mp.get_context("spawn")

    def launch(n: int, threads: int) -> list[float]:
        queue = ctx.Queue()
        barrier = ctx.Barrier(n) if n > 1 else None
        procs = [
            ctx.Process(target=process_worker, args=(threads, iterations, repeats, barrier, queue))
            for _ in range(n)
        ]
        for p in procs:
            p.start()
        out = [queue.get() for _ in procs]
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"a benchmark process exited with {p.exitcode}")
        return out

    two = launch(2, 1)
    (one,) = launch(1, 2)
    two_rate = sum(1 / s for s in two)
    return {
        "model": "resnet18",
        "image_size": 32,
        "restarts": 1,
        "iterations": iterations,
        "repeats": repeats,
        "two_processes_one_thread_it_per_s": [round(1 / s, 2) for s in two],
        "two_processes_one_thread_total_it_per_s": round(two_rate, 2),
        "one_process_two_threads_it_per_s": round(1 / one, 2),
        "processes_over_threads": round(two_rate * one, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--models", nargs="+", default=["resnet18", "cnn3"], choices=["resnet18", "cnn3"]
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 64], help="ResNet-18 only")
    p.add_argument("--restarts", type=int, default=4)
    p.add_argument("--iterations", type=int, default=None, help="default: 5 on CPU, 50 on CUDA")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--check-iterations", type=int, default=60)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--processes", action="store_true", help="also 2 processes vs 2 threads")
    p.add_argument("--quick", action="store_true", help="a smoke run: one size, few iterations")
    add_devices_argument(p)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    full_float32()  # as the pipeline's jobs run (no TF32 on a GPU)
    if a.quick:
        a.sizes, a.repeats, a.check_iterations = a.sizes[:1], 1, 20
    devices = available_devices(a.devices)

    def iterations(device: torch.device) -> int:
        if a.iterations is not None:
            return a.iterations
        if a.quick:
            return 2 if device.type == "cpu" else 10
        return 5 if device.type == "cpu" else 50

    cases = [
        (m, s)
        for m in a.models
        for s in (a.sizes if m == "resnet18" else [32])  # cnn3 at its default scale only
    ]
    report: dict[str, Any] = {
        "machine": {
            "cpu_threads": a.threads,
            "cpu_count": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
        },
        "speed": [
            speed(m, s, d, a.restarts, iterations(d), a.repeats) for d in devices for m, s in cases
        ],
        "correctness": {
            "criterion": {
                "first_step_image_gradient_rel": GRADIENT_TOL,
                "unsigned": f"same best restart, pixels within {PIXEL_TOL}, "
                f"distance within {DISTANCE_TOL[False]} relative",
                "signed": f"same best restart, distance within {DISTANCE_TOL[True]} relative, "
                f"at most {SIGNED_DIVERGED_FRACTION:.0%} of pixel values more than "
                f"{PIXEL_TOL} apart",
            },
            "devices": [correctness(d, a.check_iterations) for d in devices],
        },
    }
    if a.processes:
        report["processes"] = processes(iterations(CPU), a.repeats)
    ok = all(c["passed"] for c in report["correctness"]["devices"])
    report["correctness"]["passed"] = ok
    out = Path("results/benchmarks/restarts.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
