"""Stage: score a cell's reconstructions against its victims' private batches; log the attacks.

This is the only stage that reads the private batch, and only to measure. One job scores every
victim of a cell (a dataset, model, defense, round, batch size and attack) and writes their flat
records to one file (the table's sole input), and mirrors each attack run to MLflow for
browsing. Beside the attack's values it scores the floor (:mod:`gradinv.stages.floor`, the public
split's mean image) against the same originals, under ``floor``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gradinv.io import load_tensors, write_json
from gradinv.metrics import METRICS, MetricSettings, score
from gradinv.metrics.evaluation_network import resolve_evaluation_network, weights_digest
from gradinv.mlflow_run import side_by_side
from gradinv.sensitive import BATCH, sensitive_samples
from gradinv.settings import from_mapping
from gradinv.stages.common import project_path, record, setup, victim_runs

TRACKED = ("mse", "psnr", "ssim", "lpips", "noise_ratio", "label_accuracy")


def run(
    settings: dict[str, Any],
    reconstructions: list[Path],
    victim_files: list[Path],
    captures: list[Path],
    out: Path,
    *,
    model: str,
    round: int,
    floor: Path | None = None,
) -> None:
    """Score one cell's victims (victim v: its result in the attack files ``reconstructions``,
    its capture in the capture files ``captures``, both files of victims 0, 1, ... in order, and
    its private batch ``victim_files[v]``) in one process and write their records to ``out``,
    ``{"runs": [...]}``: one job per cell rather than per victim, since scoring takes far less
    time than starting a process that imports torch.
    ``floor``: the public split's mean image (:mod:`gradinv.stages.floor`), scored against the
    same originals with the same metrics (each record's ``floor``); None leaves it out."""
    setup(settings)
    n = len(victim_files)
    results, clients = victim_runs(reconstructions, n), victim_runs(captures, n)
    metric_cfg = dict(settings["metrics"])
    names = metric_cfg.pop("names")
    metric_settings = resolve_evaluation_network(  # noise_ratio: the dataset's own network
        from_mapping(MetricSettings, metric_cfg, where="metrics"), settings["dataset"]
    )
    floor_image = None if floor is None else load_tensors(floor)["image"]
    rows = []
    for victim, (found, victim_file, (_, _, capture)) in enumerate(
        zip(results, victim_files, clients, strict=True)
    ):
        row, rec, secret = score_run(
            settings,
            found,
            victim_file,
            capture,
            names,
            metric_settings,
            model,
            round,
            victim,
            floor_image,
        )
        rows.append(row)
        _track(settings, row, rec, secret)
    write_json(out, {"runs": rows})


def score_run(
    settings: dict[str, Any],
    found: tuple[Path, int, dict[str, Any]],
    victim_path: Path,
    capture: dict[str, Any],
    names: list[str],
    metric_settings: MetricSettings,
    model: str,
    round: int,
    victim: int,
    floor_image: Any = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """One victim's record (the flat metrics a table reads), its reconstruction and its private
    batch; ``found``: its attack result, and the file and index it came from."""
    reconstruction, index, rec = found
    secret = load_tensors(victim_path)
    defense, attack = settings["defense"], settings["attack"]
    summary = rec.get("summary", {})
    row: dict[str, Any] = {
        "dataset": settings["dataset"],
        "dataset_label": settings["dataset_label"],
        "paper_dataset": settings["dataset_label"] if settings["scale"] == "paper" else None,
        "model": model,
        "defense": settings["defense_name"],
        "defense_label": defense["label"],
        "defense_kind": defense["kind"],
        "attack": settings["attack_name"],
        "attack_label": attack["label"],
        "attack_kind": attack["kind"],
        "round": round,
        "batch_size": len(secret["labels"]),
        "victim": victim,
        # the files behind the record: the figures draw the pair it scored
        "reconstruction": str(reconstruction),
        "reconstruction_index": index,
        "victim_file": str(victim_path),
        "status": rec["status"],
        "failure": rec["failure"],
        # What the attacker knew: the threat model, and the layers whose gradients it matched.
        "threat_model": settings["threat_model"]
        | {
            k: summary.get(k)
            for k in ("server", "labels_from", "matched_layers", "transform_aware", "eot")
        },
        "attack_seconds": rec["seconds"],
        "attack_iterations_per_second": summary.get("iterations_per_second"),
        "restarts_layout": summary.get("restarts_layout"),
        **record(settings, secret["data_sha256"]),
    }
    client = capture.get("client") or {}
    # A defense that protects some samples only (DCS²) is measured on those, as its paper does,
    # and so is every other defense of a table with it: the same images on both sides of a pair.
    # A table with ``scored: batch`` measures every sample (DCS²'s Table 3: "all data").
    sensitive = client.get("sensitive")
    on = settings.get("scored_on")
    if on == BATCH:
        sensitive = None
        row["scored_on"] = BATCH
    elif sensitive is None and on is not None:
        sensitive = sensitive_samples(on["rule"], [int(y) for y in secret["labels"]])
        row["scored_on"] = on["defense"]
    originals = secret["images"] if sensitive is None else secret["images"][sensitive]
    row["scored_samples"] = list(range(len(secret["labels"]))) if sensitive is None else sensitive
    scores: dict[str, Any] = {}
    if rec["status"] == "ok" and len(originals) == 0:  # counted apart: neither ok nor failed
        reason = "the batch holds no sensitive sample: the defense protected none of it"
        row |= {"status": "not_scored", "failure": reason}
    if row["status"] == "ok":
        predicted = None if settings["threat_model"]["labels"] == "known" else rec["labels"]
        scores = score(
            rec["images"],
            originals,
            metrics=names,
            settings=metric_settings,
            mean=secret["mean"],
            std=secret["std"],
            predicted_labels=predicted,
            true_labels=secret["labels"],
        )
    for name in names:
        row[name] = scores.get(name)
    # The floor: what an image knowing nothing of the victim scores on the same originals
    # (label accuracy, match and the like say nothing of it)
    if floor_image is not None and len(originals):
        uninformed = floor_image.expand_as(originals).contiguous()
        floor_scores = score(
            uninformed,
            originals,
            metrics=[n for n in names if n != "label_accuracy"],
            settings=metric_settings,
            mean=secret["mean"],
            std=secret["std"],
        )
        row["floor"] = {n: floor_scores.get(n) for n in names if n != "label_accuracy"}
    if row.get("noise_ratio") is not None:  # which evaluation network measured it
        row["evaluation_network_weights"] = weights_digest(
            project_path(metric_settings.evaluation_network)
        )
    row["attack_success"] = _success_rate(scores.get("ssim_per_image"), metric_settings)
    row["client_seconds"] = client.get("client_seconds")  # Refiner's Table 4
    row["update_cosine"] = client.get("update_cosine")
    fired = client.get("fallback_fired")
    row["fallback_rate"] = None if fired is None else float(fired)
    # CENSOR under Algorithm 1: the victim's update was its raw gradient (None: not CENSOR)
    raw = client.get("raw_gradient_shared")
    row["raw_gradient_shared"] = raw
    row["raw_gradient"] = None if raw is None else float(raw)
    row["defense_diagnostics"] = client.get("defense")
    for name in METRICS:  # the metrics that can be unavailable (LPIPS, noise ratio) say why
        if METRICS.get(name).reports_status:
            why = {"failed": "not computed: attack failed", "ok": "not requested"}.get(
                row["status"],
                f"not computed: {row['failure']}",  # not_scored: no sample to score
            )
            row[f"{name}_status"] = scores.get(f"{name}_status", why)
    row["label_accuracy"] = scores.get("label_accuracy")
    row["matching"] = scores.get("matching")
    return row, rec, secret


def _track(
    settings: dict[str, Any], row: dict[str, Any], rec: dict[str, Any], secret: dict[str, Any]
) -> None:
    from gradinv.stages.tracking import log_job

    key = "/".join(
        str(row[k])
        for k in ("dataset", "model", "defense", "attack", "round", "batch_size", "victim")
    )
    metrics = {
        k: row[k]
        for k in (
            *TRACKED,
            "attack_success",
            "client_seconds",
            "update_cosine",
            "fallback_rate",
            "raw_gradient",
        )
        if k in row and row[k] is not None and not _is_bad(row[k])
    }
    metrics["attack_seconds"] = row["attack_seconds"]
    if row["attack_iterations_per_second"] is not None:
        metrics["attack_iterations_per_second"] = row["attack_iterations_per_second"]
    history = {
        k: [(int(s), float(v)) for s, v in pts]
        for k, pts in rec.get("history", {}).items()
        if k.startswith("loss")
    }
    images = {}
    if rec["status"] == "ok":  # one picture per image: the original | the reconstruction
        for i in range(len(secret["images"])):
            images[f"victim{row['victim']}_{i}_original_vs_reconstruction"] = side_by_side(
                secret["images"][i], rec["images"][i]
            )
    unavailable = {  # a metric asked for that could not be computed, and why (LPIPS' weights)
        name: status
        for name in METRICS
        if METRICS.get(name).reports_status
        and (status := row.get(f"{name}_status")) not in (None, "ok", "not requested")
    }
    where = f"{row['dataset']} {row['model']}, round {row['round']}, batch {row['batch_size']}"
    log_job(
        settings,
        kind="attack",
        run_name=f"{row['defense']} × {row['attack']}, victim {row['victim']} ({where})",
        job_key=f"attack/{key}",
        params={
            "attack": settings["attack"],
            "defense": settings["defense"],
            "threat_model": settings["threat_model"],
            "metrics": settings["metrics"],
            "round": row["round"],
            "batch_size": row["batch_size"],
            "victim": row["victim"],
            "dataset": row["dataset"],
            "model": row["model"],
        },
        metrics=metrics,
        history=history,
        summary=row,
        images=images,
        unavailable=unavailable,
    )


def _success_rate(ssim: list[float] | None, settings: MetricSettings) -> float | None:
    """The CVB paper's attack success: the fraction of the batch's images reconstructed at SSIM
    ``success_ssim`` or above (0 or 1 for one image; a table's mean over victims is its ASR)."""
    if not ssim:
        return None
    return sum(v >= settings.success_ssim for v in ssim) / len(ssim)


def _is_bad(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)
