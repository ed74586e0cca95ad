"""Soteria: what does one defended client update cost, batched or feature by feature?

    python benchmarks/soteria.py [--repeats 3] [--device cpu] [--threads T] [--batch 8]
        [--models resnet18 cnn3 lenet]

On each model (ResNet-18 with the small-image stem at width 64, the 3-layer CNN, LeNet), 32x32,
batch ``--batch`` (8; DCS²'s recipe trains with 64), untrained (seed 0), eval mode, on
``--device`` (CUDA when present, else the CPU): the median seconds over ``--repeats`` runs of an
undefended client update (one gradient) and of a Soteria update (prune 0.1) with ``derivatives``
``batched`` (``torch.func.vmap`` over the features) and ``per_feature`` (the official code's
loop, one backward pass per feature). One undefended update warms up first; a Soteria update
runs one backward pass per feature of the classifier's input (512, 1024 and 768 here), so
one-time costs are amortized within it. Ratios: each over the undefended update, and per_feature
over batched (the speedup of batching). Both must prune the same features (exit code 1
otherwise). Also the features whose ratio is 0 (dead ReLU units): when they exceed a tenth, the
10th percentile is 0 and nothing is pruned.

Prints a markdown table and writes results/benchmarks/soteria.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from timing import median_seconds  # benchmarks/timing.py, beside this script

from gradinv.defenses import build_defense, gradients_of
from gradinv.models import build_model, classifier_layer
from gradinv.protocol import ModelSpec

SIZE = 32
SETTINGS = {"resnet18": {"small_image_stem": True, "width": 64}, "cnn3": {}, "lenet": {}}


def row(name: str, device: torch.device, repeats: int, batch: int) -> dict[str, object]:
    model = build_model(ModelSpec(name, 10, 3, SIZE, SETTINGS[name]), seed=0).to(device).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, SIZE, SIZE, generator=g).to(device)
    y = torch.arange(batch, device=device) % 10
    fc_name, fc = classifier_layer(model)

    def plain():
        return gradients_of(model, x, y, F.cross_entropy)

    defenses = {
        mode: build_defense("soteria", {"derivatives": mode}, "benchmark")
        for mode in ("batched", "per_feature")
    }
    shared = {}

    def soteria(mode: str):
        def update():
            shared[mode] = defenses[mode].shared_update(
                model, x, y, F.cross_entropy, torch.Generator()
            )

        return update

    plain()  # warm-up
    undefended = median_seconds(plain, repeats, device)
    batched = median_seconds(soteria("batched"), repeats, device)
    per_feature = median_seconds(soteria("per_feature"), repeats, device)
    zeros = {m: shared[m][f"{fc_name}.weight"].eq(0).all(dim=0) for m in shared}
    return {
        "model": name,
        "device": str(device),
        "features": fc.in_features,
        "pruned": defenses["batched"].last["pruned_features"],
        "zero_ratio": defenses["batched"].last["zero_ratio_features"],
        "undefended_s": round(undefended, 4),
        "batched_s": round(batched, 3),
        "per_feature_s": round(per_feature, 3),
        "batched_over_undefended": round(batched / undefended, 1),
        "per_feature_over_undefended": round(per_feature / undefended, 1),
        "per_feature_over_batched": round(per_feature / batched, 2),
        "same_pruned_features": bool(torch.equal(zeros["batched"], zeros["per_feature"])),
    }


COLUMNS = {  # header: key of a row
    "model": "model",
    "device": "device",
    "features": "features",
    "zero ratio": "zero_ratio",
    "pruned": "pruned",
    "undefended s": "undefended_s",
    "batched s": "batched_s",
    "per_feature s": "per_feature_s",
    "batched / undef.": "batched_over_undefended",
    "per_feature / undef.": "per_feature_over_undefended",
    "per_feature / batched": "per_feature_over_batched",
    "same mask": "same_pruned_features",
}


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[k]) for k in COLUMNS.values()) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--models", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    rows = [row(name, device, a.repeats, a.batch) for name in a.models]
    report = {
        "machine": {
            "cpu_threads": a.threads,
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
            "torch": torch.__version__,
        },
        "batch": a.batch,
        "image_size": SIZE,
        "repeats": a.repeats,
        "rows": rows,
    }
    out = Path("results/benchmarks/soteria.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(rows))
    return 0 if all(r["same_pruned_features"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
