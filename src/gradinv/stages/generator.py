"""Stage: the attacker's generator. Train one on the public split, or fetch published weights.

``train``: the generative-prior attacks at the embedded scale use a DCGAN trained here on the
dataset's public split (``partition.public_fraction``: train images no client holds). The file
records what produced it and is tracked by DVC; a grid of samples per class is drawn beside it.
``fetch``: the full-scale generators (BigGAN, StyleGAN2) come as published weights, verified by
sha256 before they are written where the attacks load them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from gradinv.data import load_prepared
from gradinv.generators.dcgan import train_dcgan
from gradinv.generators.files import fetch_weights, own_settings, save_trained
from gradinv.io import sha256_file, sha256_json
from gradinv.progress import Progress
from gradinv.resources import acquire_device
from gradinv.stages.common import derive_seed, project_path, public_split, record, setup


def train(settings: dict[str, Any], prepared_dir: Path, partition: Path, out: Path) -> None:
    setup(settings)
    name, block, dataset = settings["generator_name"], settings["generator"], settings["dataset"]
    ds = load_prepared(dataset, prepared_dir)
    public = public_split(settings, ds, partition, f"generators.{name}")
    images, labels = ds.train_subset(public)
    s = own_settings(name, block)
    generator = torch.Generator().manual_seed(
        derive_seed(settings["seed"], "generator", name, dataset)
    )
    progress = Progress.for_output(out, sha256_json([settings, ds.sha256, sha256_file(partition)]))
    began = time.perf_counter()
    with acquire_device(settings["device"]) as device:
        model, history = train_dcgan(s, images, labels, ds.num_classes, generator, progress, device)
    seconds = round(time.perf_counter() - began, 1)
    provenance = record(settings, ds.sha256) | {"partition_sha256": sha256_file(partition)}
    save_trained(
        out,
        name,
        block["kind"],
        model,
        num_classes=ds.num_classes,
        dataset=dataset,
        classes=list(ds.classes),
        public_images=len(public),
        history=history,
        seconds=seconds,
        provenance=provenance,
    )
    samples = out.with_name(f"{out.stem}_samples.png")
    _draw_samples(model, ds.classes, samples, generator, f"{name} on {dataset}", settings["scale"])
    progress.finish()  # after the figure: a failed drawing resumes instead of retraining
    _track(settings, name, dataset, len(public), seconds, history, provenance, out)


def fetch(settings: dict[str, Any], out: Path) -> None:
    """Put the published weights at ``out``; a relative ``local_path`` is the project's."""
    block = dict(settings["generator"])
    if block.get("local_path"):
        block["local_path"] = str(project_path(Path(block["local_path"]).expanduser()))
    fetch_weights(settings["generator_name"], block, out)


def _draw_samples(
    model: Any, classes: Any, path: Path, generator: torch.Generator, what: str, scale: str
) -> None:
    """Eight samples of every class (one row per class), to judge the generator by eye."""
    from matplotlib.figure import Figure

    from gradinv.tables.figures import figure_caption, save_figure

    rows = max(model.num_classes, 1)
    labels = torch.arange(rows).repeat_interleave(8)
    with torch.no_grad():
        z = torch.randn(len(labels), *model.latent_shape, generator=generator)
        images = (model(z, labels) + 1) / 2
    fig = Figure(figsize=(8, rows))
    axes = fig.subplots(rows, 8, squeeze=False)
    for ax, image in zip(axes.flat, images, strict=True):
        ax.imshow(image.permute(1, 2, 0).clamp(0, 1).numpy())
        ax.axis("off")
    for r in range(rows):
        axes[r, 0].set_title(str(classes[r]) if model.num_classes else "", fontsize=6, loc="left")
    caption = figure_caption(
        f"The attacker's generator ({what}): 8 samples per class", scale, "params.yaml's generators"
    )
    save_figure(fig, path, caption)


def _track(
    settings: dict[str, Any],
    name: str,
    dataset: str,
    public: int,
    seconds: float,
    history: dict[str, list[tuple[int, float]]],
    provenance: dict[str, Any],
    out: Path,
) -> None:
    from gradinv.stages.tracking import log_job

    key = f"{dataset}/{name}"
    log_job(
        settings,
        kind="train_generator",
        run_name=f"generator {key}",
        job_key=f"generator/{key}",
        params={"generator": settings["generator"], "public_images": public},
        metrics={k: v[-1][1] for k, v in history.items() if v} | {"seconds": seconds},
        history=history,
        summary={"status": "ok", **provenance},
        artifacts={"samples": out.with_name(f"{out.stem}_samples.png")},
    )
