"""Stage: what a defense costs a client in time (Refiner's Table 4), and its table.

``measure`` times one client's defended update on a batch of ``batch_size`` training images, on
the initial model (round 0, the seed's), ``repeats`` times after one untimed call, and records
the median and every time. The calls run on one defense object, as successive rounds of one
client: Refiner's warm start then reuses the robust data of the call before, and the untimed
first call is the paper's "first round" that has none. ``report`` lays the medians out as the
paper does (defenses by models), with the published seconds beside them, and writes
``refiner_table4_time_vs_paper.csv``: ours and the paper's seconds per (defense, model), the
paper's model through ``client_time.paper_models``, each also as a ratio to the study's first
defense on the same model.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from gradinv.data import load_prepared
from gradinv.fl.client import client_update
from gradinv.io import atomic_path, read_json, write_json
from gradinv.models import build_model
from gradinv.protocol import normalize
from gradinv.resources import acquire_device, synchronize
from gradinv.stages.common import (
    derive_seed,
    project_path,
    record,
    setup,
    training_client,
    update_lr,
)
from gradinv.tables.html import write_markdown_page
from gradinv.tables.render import write_csv


def measure(settings: dict[str, Any], prepared_dir: Path, out: Path) -> None:
    setup(settings)
    study = settings["client_time"]
    ds = load_prepared(settings["dataset"], prepared_dir)
    defense, spec = training_client(settings, ds, update_lr(settings["fl"]))
    fl = settings["fl"]
    protocol = {k: fl[k] for k in ("protocol", "local_steps", "local_lr")}
    seed = derive_seed(
        settings["seed"], "client_time", settings["dataset"], settings["defense_name"]
    )
    n = min(study["batch_size"], len(ds.train_labels))
    # Evenly spaced training images: the split is sorted by class.
    every = len(ds.train_labels) // n
    images, labels = ds.train_subset(range(0, len(ds.train_labels), every)[:n])
    times = []
    with acquire_device(settings["device"]) as device:
        model = build_model(spec, seed=settings["seed"]).to(device)
        model.train()  # a client training its round
        inputs = normalize(images, ds.mean, ds.std).to(device)
        labels = labels.to(device)
        for call in range(study["repeats"] + 1):
            synchronize(device)
            start = time.perf_counter()
            client_update(
                model,
                inputs,
                labels,
                defense,
                **protocol,
                generator=torch.Generator().manual_seed(seed + call),
            )
            synchronize(device)
            times.append(time.perf_counter() - start)
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    write_json(
        out,
        {
            "dataset": settings["dataset"],
            "model": settings["model_name"],
            "defense": settings["defense_name"],
            "defense_label": settings["defense"]["label"],
            "batch_size": n,
            "seconds": statistics.median(times[1:]),
            "first_call_seconds": times[0],
            "timed_seconds": times[1:],
            "device": device_name,
            "threads": torch.get_num_threads(),
            **record(settings, ds.sha256),
        },
    )


def report(settings: dict[str, Any], files: list[Path], out_dir: Path) -> None:
    """``refiner_table4_time.csv``/``.md``: median seconds by defense (rows) and model; and
    ``refiner_table4_time_vs_paper.csv``: ours beside the paper's, in seconds and relative to the
    study's first defense on the same model (seconds on different hardware do not compare, ratios
    do)."""
    study = settings["client_time"]
    runs = pd.DataFrame.from_records([read_json(p) for p in files])
    table = runs.pivot(index="defense", columns="model", values="seconds")
    table = table.reindex(index=study["defenses"], columns=study["models"])
    table.insert(0, "defense_label", [settings["labels"][d] for d in table.index])
    table = table.reset_index()
    table["scale"] = settings["scale"]
    write_csv(table, out_dir / "refiner_table4_time.csv")
    comparison = _vs_paper(table, study, _published(settings), settings["scale"])
    write_csv(comparison, out_dir / "refiner_table4_time_vs_paper.csv")
    lines = [f"# {study['title']}", ""]
    if settings["scale"] == "embedded":
        lines += [f"> **SCALED-DOWN run.** {study['scaled_down_note'].strip()}", ""]
    devices = ", ".join(sorted(set(runs["device"])))
    lines += [
        f"Median seconds a client spends on one round's defended update (batch of "
        f"{int(runs['batch_size'].iloc[0])} images, {study['repeats']} timed calls after an "
        f"untimed first one), measured on: {devices}. In parentheses: the paper's seconds "
        "(an A10 GPU, batch 128), where it reports the cell"
        + _paper_models_note(study)
        + "; `refiner_table4_time_vs_paper.csv` puts both beside each other, also as ratios "
        f"to {settings['labels'][study['defenses'][0]]} on the same model.",
        "",
        "| defense | " + " | ".join(study["models"]) + " |",
        "|---|" + "---|" * len(study["models"]),
    ]
    paper_seconds = comparison.set_index(["defense", "model"])["paper"]
    for row in table.to_dict("records"):
        cells = []
        for model in study["models"]:
            published = paper_seconds.get((row["defense"], model))
            ours = "" if pd.isna(row[model]) else f"{row[model]:.4f}"
            cells.append(ours + ("" if pd.isna(published) else f" ({published:g})"))
        lines.append(f"| {row['defense_label']} | " + " | ".join(cells) + " |")
    models = ", ".join(f"{m} {settings['models'][m]}" for m in study["models"])
    lines += [
        "",
        f"Models: {models}.",
        f"git commit(s): {', '.join(sorted(set(map(str, runs['git_commit']))))}",
        "",
    ]
    with atomic_path(out_dir / "refiner_table4_time.md") as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    write_markdown_page(
        out_dir / "refiner_table4_time.html",
        title="Refiner Table 4: the client's time",
        markdown_text="\n".join(lines),
    )


def _vs_paper(
    table: pd.DataFrame,
    study: dict[str, Any],
    published: dict[tuple[str, str], float],
    scale: str,
) -> pd.DataFrame:
    """One row per (defense, model): our seconds and the paper's (its column ``paper_model``:
    ``paper_models`` maps a model of ours to the paper's it stands in for), and each as a ratio to
    the first defense of the study on the same model."""
    paper_models = study.get("paper_models") or {}
    base = table.set_index("defense").loc[study["defenses"][0]]
    rows = []
    for rec in table.to_dict("records"):
        for model in study["models"]:
            paper_model = paper_models.get(model, model)
            paper = published.get((paper_model, rec["defense_label"]))
            paper_base = published.get((paper_model, base["defense_label"]))
            ours = rec[model]
            rows.append(
                {
                    "defense": rec["defense"],
                    "defense_label": rec["defense_label"],
                    "model": model,
                    "paper_model": paper_model,
                    "ours": ours,
                    "paper": paper,
                    "ours_ratio": ours / base[model],
                    "paper_ratio": None if paper is None or not paper_base else paper / paper_base,
                    "ratio_to": base["defense_label"],
                    "scale": scale,
                }
            )
    return pd.DataFrame.from_records(rows)


def _paper_models_note(study: dict[str, Any]) -> str:
    pairs = [(o, p) for o, p in (study.get("paper_models") or {}).items() if o in study["models"]]
    if not pairs:
        return ""
    return " (" + ", ".join(f"{ours} against the paper's {paper}" for ours, paper in pairs) + ")"


def _published(settings: dict[str, Any]) -> dict[tuple[str, str], float]:
    reference = settings["client_time"]["reference"]
    if not reference:
        return {}
    ref = pd.read_csv(project_path(reference))
    return {(r["model"], r["defense"]): float(r["value"]) for r in ref.to_dict("records")}
