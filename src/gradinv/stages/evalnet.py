"""Stage: Refiner's evaluation network (arXiv:2212.02042, Section 3.3 and Appendix D).

Trained on the dataset's public split (``partition.public_fraction``: train images no client
holds), as a client would train it from public data; the paper used TinyImageNet for every
dataset, which the embedded scale does not have. It is calibrated on held-out images (evenly
spaced validation images, which it never saw) mixed with noise at every training ratio: the mean
and spread of its predictions per true ratio (the paper's Fig. 4) go into the file and a figure
beside it. Refiner's defense and the ``noise_ratio`` metric load the file; DVC tracks it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gradinv.config import method_settings
from gradinv.data import PreparedDataset, load_prepared
from gradinv.io import sha256_file, sha256_json
from gradinv.metrics.evaluation_network import (
    PRIVACY_THRESHOLD,
    EvaluationNetworkSettings,
    calibration,
    save_evaluation_network,
    train_evaluation_network,
)
from gradinv.progress import Progress
from gradinv.resources import acquire_device
from gradinv.settings import from_mapping
from gradinv.stages.common import derive_seed, public_split, record, setup

# Held-out images of the calibration: enough for a mean per ratio to within about 0.01.
CALIBRATION_IMAGES = 300


def run(settings: dict[str, Any], prepared_dir: Path, partition: Path, out: Path) -> None:
    setup(settings)
    dataset, block = settings["dataset"], settings["evaluation_network"]
    s = from_mapping(EvaluationNetworkSettings, method_settings(block), "evaluation_network")
    ds = load_prepared(dataset, prepared_dir)
    public = public_split(settings, ds, partition, "evaluation_network")
    images, _ = ds.train_subset(public)
    held_out = _held_out(ds)
    generator = torch.Generator().manual_seed(derive_seed(settings["seed"], "evalnet", dataset))
    # Its own generator: the calibration does not move when the training's length changes.
    calibration_generator = torch.Generator().manual_seed(
        derive_seed(settings["seed"], "evalnet", dataset, "calibration")
    )
    progress = Progress.for_output(out, sha256_json([settings, ds.sha256, sha256_file(partition)]))
    began = time.perf_counter()
    with acquire_device(settings["device"]) as device:
        network, history = train_evaluation_network(images, s, generator, progress, device)
        ratios = torch.linspace(0, 1, s.ratios)
        rows = calibration(network.to(device), held_out, ratios, calibration_generator)
    network.to("cpu")
    seconds = round(time.perf_counter() - began, 1)
    error = sum(abs(r["mean"] - r["ratio"]) for r in rows) / len(rows)
    _print_calibration(rows)
    provenance = record(settings, ds.sha256) | {"partition_sha256": sha256_file(partition)}
    save_evaluation_network(
        out,
        network,
        dataset=dataset,
        settings=dataclasses.asdict(s),
        public_images=len(public),
        calibration_images=int(held_out.shape[0]),
        history=history,
        calibration=rows,
        calibration_error=error,
        seconds=seconds,
        provenance=provenance,
    )
    figure = out.with_name(f"{out.stem}_calibration.png")
    _draw_calibration(rows, dataset, int(held_out.shape[0]), figure, settings["scale"])
    progress.finish()  # after the figure: a failed drawing resumes instead of retraining
    _track(settings, dataset, len(public), seconds, history, rows, error, provenance, figure)


def _held_out(ds: PreparedDataset) -> torch.Tensor:
    """At most CALIBRATION_IMAGES validation images, evenly spaced (so every class is in)."""
    n = int(ds.val_labels.numel())
    if n == 0:
        raise ValueError(f"{ds.name} has no validation images to calibrate the network on")
    idx = torch.linspace(0, n - 1, min(n, CALIBRATION_IMAGES)).round().long().unique()
    return ds.val_batch(idx)[0]


def _print_calibration(rows: list[dict[str, float]]) -> None:
    print("gradinv: calibration on held-out images (true ratio: mean ± std)", file=sys.stderr)
    for r in rows:
        print(f"  {r['ratio']:.2f}: {r['mean']:.3f} ± {r['std']:.3f}", file=sys.stderr)


def _draw_calibration(
    rows: list[dict[str, float]], dataset: str, count: int, path: Path, scale: str
) -> None:
    """Predicted against true noise ratio, with the ideal diagonal and the paper's threshold."""
    from matplotlib.figure import Figure

    from gradinv.tables.figures import figure_caption, save_figure

    fig = Figure(figsize=(4.2, 4))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="ideal (predicted = true)")
    ax.axhline(PRIVACY_THRESHOLD, ls=":", color="tab:red", lw=1, label="Refiner's threshold 0.4")
    ax.errorbar(
        [r["ratio"] for r in rows],
        [r["mean"] for r in rows],
        yerr=[r["std"] for r in rows],
        marker="o",
        ms=4,
        capsize=3,
        label=f"mean ± std, {count} held-out images",
    )
    ax.set(
        xlabel="true noise ratio r",
        ylabel="predicted noise ratio D(x)",
        xlim=(-0.05, 1.05),
        ylim=(-0.05, 1.05),
        title=f"{dataset}: evaluation network",
    )
    ax.legend(fontsize=7, loc="upper left")
    title = f"Refiner's evaluation network for {dataset}, calibrated on held-out images"
    save_figure(fig, path, figure_caption(title, scale, "params.yaml's evaluation_network block"))


def _track(
    settings: dict[str, Any],
    dataset: str,
    public: int,
    seconds: float,
    history: dict[str, list[tuple[int, float]]],
    rows: list[dict[str, float]],
    error: float,
    provenance: dict[str, Any],
    figure: Path,
) -> None:
    from gradinv.stages.tracking import log_job

    log_job(
        settings,
        kind="train_evalnet",
        run_name=f"evalnet {dataset}",
        job_key=f"evalnet/{dataset}",
        params={"evaluation_network": settings["evaluation_network"], "public_images": public},
        metrics={k: v[-1][1] for k, v in history.items() if v}
        | {
            "seconds": seconds,
            "calibration_error": error,
            "clean_prediction": rows[0]["mean"],
            "noise_prediction": rows[-1]["mean"],
        },
        history=history,
        summary={"status": "ok", **provenance},
        artifacts={"calibration": figure},
    )
