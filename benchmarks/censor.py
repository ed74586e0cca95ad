"""CENSOR: how fast is a defended client update, and does its selection mean anything?

    python benchmarks/censor.py [--repeats 5] [--trials 20] [--sizes 32 64] [--devices cpu cuda]
        [--no-selection]

Speed: on ResNet-18 (small-image stem, batch 1) at each image size and on each available device
(CPU, and CUDA when present), the median time of an undefended client update (one gradient) and
of a CENSOR update with T trials, its candidates scored one after another (``sequential``) and in
one ``torch.func.vmap`` pass (``batched``). Both must select the same candidate. It also times
``draws: device`` (each layer's T directions drawn at once on the device and projected in one
pass), scored as ``evaluation: auto`` would (batched on CUDA, sequential on the CPU). Ratios are
measured side by side in one run.

Selection: for both projections, float32 and float64, and several η, the candidates' loss
L(θ − η·G_t) minus the undefended loss L(θ), how many candidates lower it, and the cosine of the
selected candidate (and the mean over all candidates) with the true gradient.

Writes results/benchmarks/censor.json and prints both tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from timing import (
    add_devices_argument,
    available_devices,
    median_seconds,
)  # benchmarks/timing.py, beside this script

from gradinv.defenses import build_defense, gradient_cosine, gradients_of
from gradinv.models import build_model
from gradinv.protocol import ModelSpec
from gradinv.stages.common import full_float32


def setup(size: int, device: torch.device, dtype: torch.dtype = torch.float32):
    spec = ModelSpec("resnet18", 10, 3, size, {"small_image_stem": True})
    model = build_model(spec, seed=0).to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 3, size, size, generator=g).to(device=device, dtype=dtype)
    return model, x, torch.tensor([3], device=device)


def speed(size: int, device: torch.device, trials: int, repeats: int) -> dict[str, object]:
    model, x, y = setup(size, device)
    defenses = {
        mode: build_defense(
            "censor", {"trials": trials, "evaluation": mode}, "benchmark", update_lr=0.1
        )
        for mode in ("sequential", "batched")
    }

    def censor(mode: str):
        return lambda: defenses[mode].shared_update(
            model, x, y, F.cross_entropy, torch.Generator().manual_seed(1)
        )

    plain = median_seconds(lambda: gradients_of(model, x, y, F.cross_entropy), repeats, device)
    seq = median_seconds(censor("sequential"), repeats, device)
    bat = median_seconds(censor("batched"), repeats, device)
    same = defenses["sequential"].last["selected"] == defenses["batched"].last["selected"]
    # draws: device: each layer's T directions in one call on the device, projected in one pass
    evaluation = "batched" if device.type == "cuda" else "sequential"  # what auto picks
    defenses["device-draws"] = build_defense(
        "censor",
        {"trials": trials, "evaluation": evaluation, "draws": "device"},
        "benchmark",
        update_lr=0.1,
    )
    fast = median_seconds(censor("device-draws"), repeats, device)
    draws = {
        "censor_device_draws_s": round(fast, 4),
        "device_draws_over_undefended": round(fast / plain, 2),
        "device_draws_evaluation": evaluation,
    }
    return {
        "device": str(device),
        "image_size": size,
        "trials": trials,
        "undefended_s": round(plain, 4),
        "censor_sequential_s": round(seq, 4),
        "censor_batched_s": round(bat, 4),
        "sequential_over_undefended": round(seq / plain, 2),
        "batched_over_undefended": round(bat / plain, 2),
        "batched_speedup_over_sequential": round(seq / bat, 2),
        "auto_picks": "batched" if device.type == "cuda" else "sequential",
        "same_candidate_selected": same,
        **draws,
    }


def selection(trials: int) -> list[dict[str, object]]:
    rows = []
    for dtype in (torch.float32, torch.float64):
        model, x, y = setup(32, torch.device("cpu"), dtype)
        true = gradients_of(model, x, y, F.cross_entropy)
        for projection in ("exact", "as-coded"):
            for eta in (1e-4, 1e-2, 1e-1):
                d = build_defense(
                    "censor",
                    {"trials": trials, "projection": projection, "selection_lr": eta},
                    "benchmark",
                )
                gen = torch.Generator().manual_seed(1)
                cands = [
                    d._candidate({n: g.detach() for n, g in true.items()}, gen)
                    for _ in range(trials)
                ]
                base, losses = d._losses(model, x, y, F.cross_entropy, cands, eta)
                cos = [gradient_cosine(c, true) for c in cands]
                best = int(torch.argmin(losses))
                diff = (losses - base).tolist()
                rows.append(
                    {
                        "dtype": str(dtype).removeprefix("torch."),
                        "projection": projection,
                        "eta": eta,
                        "loss_minus_undefended_min": min(diff),
                        "loss_minus_undefended_max": max(diff),
                        "candidates_below_undefended": sum(v < 0 for v in diff),
                        "selected_cosine": round(cos[best], 4),
                        "mean_cosine": round(sum(cos) / len(cos), 4),
                    }
                )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    add_devices_argument(p)
    p.add_argument(
        "--no-selection",
        action="store_true",
        help="only the speed (the selection study runs "
        "on the CPU in float64 and takes about a minute)",
    )
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    full_float32()  # as the pipeline's jobs run (no TF32 on a GPU)
    devices = available_devices(a.devices)
    report = {
        "machine": {
            "cpu_threads": a.threads,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__,
        },
        "speed": [speed(s, d, a.trials, a.repeats) for d in devices for s in a.sizes],
        "selection": [] if a.no_selection else selection(a.trials),
    }
    out = Path("results/benchmarks/censor.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    ok = all(row["same_candidate_selected"] for row in report["speed"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
