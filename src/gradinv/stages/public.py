"""Stage: CENSOR's Fig. 10, reconstructions under directions drawn from public images.

With ``source: public`` CENSOR's shared update is built from gradients of public images of one
class, so an attack that inverts it is pulled toward that class. This stage measures the pull for
every victim: the MSE of each reconstruction to its private original and to the nearest public
pool image (``closer_to_public`` when the second is smaller), and draws originals,
reconstructions under each defense of the table, and the nearest public image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gradinv.data import load_prepared
from gradinv.data.prepared import public_pool
from gradinv.io import load_tensors
from gradinv.stages.common import first_scored_pair, load_reconstruction, run_path
from gradinv.tables import GridEntry, reconstruction_grid, write_csv
from gradinv.tables.figures import figure_caption
from gradinv.tables.files import scored_runs


def run(
    settings: dict[str, Any],
    metric_files: list[Path],
    prepared_dir: Path,
    out_dir: Path,
) -> None:
    import pandas as pd

    from gradinv.config import method_settings
    from gradinv.defenses import defense_settings

    public_defense = settings["public_defense"]
    block, where = settings["defenses"][public_defense], f"defenses.{public_defense}"
    cfg = defense_settings(block["kind"], method_settings(block), where)  # with its defaults
    rows, entries, nearest = [], [], {}
    prepared: dict[str, Any] = {}
    pools: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
    for row in scored_runs(metric_files):
        rec = load_reconstruction(row)
        secret = load_tensors(run_path(row["victim_file"]))
        dataset = row["dataset"]
        if dataset not in prepared:
            prepared[dataset] = load_prepared(dataset, prepared_dir)
        batch = tuple(int(i) for i in secret["indices"])  # the pool the capture used: without it
        if (dataset, batch) not in pools:
            pools[dataset, batch] = public_pool(
                prepared[dataset], cfg.public_class, cfg.public_images, exclude=batch, where=where
            )[0]
        pool = pools[dataset, batch]
        original, image = first_scored_pair(row, rec, secret)
        record = {
            "dataset": dataset,
            "defense": row["defense"],
            "defense_label": row["defense_label"],
            "attack": row["attack"],
            "victim": row["victim"],
            "status": rec["status"],
            "mse_to_original": None,
            "mse_to_public": None,
            "closer_to_public": None,
            "scale": settings["scale"],
        }
        if image is not None:
            to_public = ((pool - image) ** 2).flatten(1).mean(1)
            best = int(torch.argmin(to_public))
            record["mse_to_original"] = float(((image - original) ** 2).mean())
            record["mse_to_public"] = float(to_public[best])
            record["closer_to_public"] = record["mse_to_public"] < record["mse_to_original"]
            if row["defense"] == public_defense:
                nearest[(row["dataset_label"], row["victim"])] = pool[best]
        rows.append(record)
        entries.append(
            GridEntry(
                dataset=row["dataset_label"],
                defense_label=row["defense_label"],
                attack_label=row["attack_label"],
                victim=row["victim"],
                original=original,
                reconstruction=image,
            )
        )
    label = f"nearest public image\n(class {cfg.public_class})"
    for (dataset_label, victim), image in nearest.items():
        first = next(e for e in entries if (e.dataset, e.victim) == (dataset_label, victim))
        entries.append(
            GridEntry(
                dataset=first.dataset,
                defense_label=label,
                attack_label="nearest public image",  # a column of its own
                victim=victim,
                original=first.original,
                reconstruction=image,
            )
        )
    write_csv(pd.DataFrame.from_records(rows), out_dir / "fig10_public_drift.csv")
    caption = figure_caption(
        f"{settings['title']}: nearest public image", settings["scale"], "fig10_public.md"
    )
    reconstruction_grid(entries, out_dir / "fig10_public.png", caption)
