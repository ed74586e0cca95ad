"""Stage: federated training of the global model under one defense, with checkpoints per round.

Long runs resume from their saved progress (:mod:`gradinv.progress`). A run whose loss or update
becomes non-finite ends as *failed*: the reason goes to summary.json and MLflow, and each
checkpoint it could not reach is written as a failure record, so every capture, attack and table
cell downstream reports the failure instead of the pipeline stopping.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from torch import nn

from gradinv.data import load_prepared, read_partition
from gradinv.fl.official import OfficialLoop, train_official
from gradinv.fl.server import FLSettings, TrainingDiverged, train
from gradinv.io import save_tensors, sha256_file, sha256_json, write_json
from gradinv.metrics.evaluation_network import weights_digest
from gradinv.models import build_model
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, normalize
from gradinv.resources import acquire_device
from gradinv.stages.common import (
    derive_seed,
    record,
    run_path,
    setup,
    training_client,
    update_lr,
)
from gradinv.stages.summary import defense_rates


def run(
    settings: dict[str, Any],
    prepared_dir: Path,
    partition_path: Path | None,
    checkpoints: dict[int | str, Path],
    summary_path: Path,
) -> None:
    """FL training on ``partition_path``; with ``settings["official_loop"]``, the loop of
    CENSOR's official code instead (:mod:`gradinv.fl.official`: central, no partition).

    ``checkpoints`` maps each round to save to its file; the key ``"final"`` stands for the
    last round (``fl.rounds``, or the loop's epochs).
    """
    setup(settings)
    dataset = settings["dataset"]
    ds = load_prepared(dataset, prepared_dir)
    official = settings.get("official_loop")
    if official:
        loop = OfficialLoop.from_dict(official)
        rounds, eval_samples, step_lr = (loop.epochs,), loop.eval_samples, loop.step_lr
        parts, partition_sha = [], None
    else:
        if partition_path is None:
            raise ValueError("FL training needs a partition (--partition)")
        parts, meta = read_partition(partition_path, len(ds.train_labels))
        if meta.get("data_sha256") != ds.sha256:
            raise RuntimeError(
                f"{partition_path} was made from another version of {dataset}; "
                "rerun snakemake to regenerate it"
            )
        fl = FLSettings.from_dict(settings["fl"])
        if max(fl.checkpoint_rounds) > fl.rounds:
            raise ValueError(
                f"fl.checkpoint_rounds asks for round {max(fl.checkpoint_rounds)} but "
                f"fl.rounds is {fl.rounds}; raise fl.rounds or drop that round"
            )
        rounds, eval_samples = fl.checkpoint_rounds, fl.eval_samples
        step_lr, partition_sha = update_lr(settings["fl"]), sha256_file(partition_path)
    last = loop.epochs if official else fl.rounds
    checkpoints = {last if r == "final" else r: path for r, path in checkpoints.items()}
    if set(checkpoints) != set(rounds):
        raise ValueError(
            f"checkpoint outputs {sorted(checkpoints)} do not match the rounds to save "
            f"{list(rounds)}"
        )
    defense, spec = training_client(settings, ds, step_lr)
    # Refiner's evaluation network is an input too: a retrained one must not resume this run
    network = settings.get("evaluation_network")
    network_sha = weights_digest(run_path(network)) if network else None
    inputs = [settings, ds.sha256, partition_sha] + ([network_sha] if network_sha else [])
    progress = Progress.for_output(summary_path, sha256_json(inputs))
    hashes: dict[str, str] = {}

    def save(rnd: int, m: nn.Module) -> None:
        state = {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
        msg = ServerMessage(model=spec, state=state, round=rnd)
        hashes[str(rnd)] = save_tensors(checkpoints[rnd], msg.to_dict())

    started = time.perf_counter()
    status, failure, history = "ok", None, []
    with acquire_device(settings["device"]) as device:
        # The initial model depends on the seed only, so round 0 is the same for every defense.
        model = build_model(spec, seed=settings["seed"]).to(device)
        train_x, train_y = ds.train_subset(range(len(ds.train_labels)))
        # Evenly spaced validation images: the validation split is sorted by class, so a prefix
        # would test on a few classes only.
        n_val = len(ds.val_labels)
        step = max(1, n_val // eval_samples) if eval_samples else 1
        test_x, test_y = ds.val_batch(range(0, n_val, step)[: eval_samples or None])
        train_x = normalize(train_x, ds.mean, ds.std).to(device)
        test_x = normalize(test_x, ds.mean, ds.std).to(device)
        try:
            # the same clients and batches for every defense at one seed (common random numbers:
            # two defenses compared seed by seed differ by the defense alone)
            seed = derive_seed(settings["seed"], "train", dataset)
            data = (train_x, train_y.to(device))
            tests = (test_x, test_y.to(device))
            if official:
                history = train_official(
                    model, *data, *tests, defense, loop, seed, save, progress=progress
                )
            else:
                history = train(
                    model, *data, parts, *tests, defense, fl, seed, save, progress=progress
                )
        except TrainingDiverged as err:
            status, failure, history = "failed", str(err), err.history
            for rnd, path in checkpoints.items():
                if str(rnd) not in hashes:
                    save_tensors(path, {"status": "failed", "failure": failure, "round": rnd})
    summary = {
        "status": status,
        "failure": failure,
        "history": history,
        "checkpoint_sha256": hashes,
        "defense_stats": getattr(defense, "stats", None),  # e.g. CENSOR's fallback count
        "privacy": None if official else privacy_budget(defense, parts, fl),
        "seconds": round(time.perf_counter() - started, 1),
        "dataset": dataset,
        "defense": settings["defense_name"],
        "model": settings["model_name"],
        "evaluation_network_weights": network_sha,
        **record(settings, ds.sha256),
    }
    write_json(summary_path, summary)
    progress.finish()
    if status != "ok":
        print(f"gradinv: training FAILED: {failure} (recorded in {summary_path})")
    _track(settings, summary)


def privacy_budget(defense: Any, parts: list[list[int]], fl: FLSettings) -> dict[str, Any] | None:
    """The (epsilon, delta) a defense that accounts privacy (DP-SGD) spent for every client: the
    largest over the clients, each counted as taking part in every round (an upper bound)."""
    if not hasattr(defense, "epsilon"):
        return None
    local_steps = fl.local_steps if fl.protocol == "fedavg" else 1
    rates = [min(fl.batch_size, len(p)) / len(p) for p in parts if p]
    epsilon = max(defense.epsilon(q, fl.rounds, local_steps) for q in set(rates))
    return {
        "epsilon": epsilon,
        "delta": defense.settings.delta,
        "accountant": defense.settings.accountant,
        "steps": fl.rounds,
        "sample_rate": max(rates),
        "bound": "every client counted in every round",
    }


def _track(settings: dict[str, Any], summary: dict[str, Any]) -> None:
    from gradinv.stages.tracking import log_job

    history: dict[str, list[tuple[int, float]]] = {}
    for row in summary["history"]:
        for key, value in row.items():
            if key != "round":
                history.setdefault(key, []).append((int(row["round"]), float(value)))
    final = {k: v[-1][1] for k, v in history.items()}
    for key, value in defense_rates(summary).items():  # CENSOR: over the whole run
        if value is not None:
            final[f"run_{key}"] = value
    epsilon = (summary.get("privacy") or {}).get("epsilon")
    if epsilon is not None and math.isfinite(epsilon):
        final["epsilon"] = epsilon
    key = f"{summary['dataset']}/{summary['model']}/{summary['defense']}"
    if settings.get("study"):  # e.g. the convergence study: another run of the same defense
        key += f" ({settings['study']})"
    log_job(
        settings,
        kind="train",
        run_name=f"train {summary['defense']} ({summary['dataset']} {summary['model']}"
        + (f", {settings['study']})" if settings.get("study") else ")"),
        job_key=f"train/{key}",
        params={
            "fl": settings["fl"],
            "defense": settings["defense"],
            "model": settings["model"],
            "partition": settings["partition"],
            "official_loop": settings.get("official_loop"),
        },
        metrics=final,
        history=history,
        summary=summary,
    )
