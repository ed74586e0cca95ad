"""Stage: render a paper table, its Markdown companion, figures and the paper comparison."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradinv.config import models_of
from gradinv.io import load_tensors, read_json
from gradinv.methods import fact
from gradinv.sensitive import scores_whole_batch
from gradinv.stages.common import (
    first_scored_original,
    first_scored_pair,
    load_reconstruction,
    project_path,
    run_path,
)
from gradinv.tables import DEFAULT_METRICS, GridEntry, reconstruction_grid, render_table
from gradinv.tables.figures import figure_caption
from gradinv.tables.files import scored_runs
from gradinv.tables.grid import NOT_KEPT
from gradinv.tables.render import Sweep, Tradeoff


def run(
    settings: dict[str, Any],
    metric_files: list[Path],
    out_dir: Path,
    summaries: Sequence[Path] = (),
    undefended: Sequence[Path] = (),
) -> None:
    """Render the table from its cells' score files (each record names the reconstruction and
    private batch it scored); ``summaries`` are the defenses' FL training runs (the utility
    study's), read when the table shows what a defense costs (accuracy, PMM); ``undefended``
    are other tables' undefended runs of its attacks, for a table without an undefended row
    (:func:`gradinv.table_inputs.undefended_score_files`)."""
    spec = settings["table"]
    name = settings["table_name"]
    rounds, n_victims = settings["rounds"], settings["victims"]
    models = models_of(spec)
    rows = (
        "dataset",
        *(["model"] if len(models) > 1 else []),
        "defense",
        *(["round"] if len(rounds) > 1 else []),
    )
    sweep = _sweep(spec.get("x_axis"), settings["defenses"], rounds)
    labels, shared = settings["labels"]["defenses"], settings["shared_runs"]
    attack_labels = {a: settings["attacks"][a]["label"] for a in spec["attacks"]}
    shared_attacks = {  # by defense run: the attack shown, from the attack run, with its label
        run: {a: (base, attack_labels[a]) for a, base in attacks.items()}
        for run, attacks in settings["shared_attacks"].items()
    }
    by_model = settings.get("attacks_by_model") or {m: settings["attacks"] for m in models}
    # an attack's settings as it runs on the table's (first) model; budgets per model below
    attack_cfgs = {a: by_model[models[0]][a] for a in spec["attacks"]}
    setting = {
        "scale": settings["scale"],
        "datasets": ", ".join(spec["datasets"]),
        "model": "; ".join(f"{m} {settings['models'][m]}" for m in models),
        "protocol": settings["fl"]["protocol"],
        "round attacked": ", ".join(map(str, rounds)),
        "batch size": _batch_sizes(settings["capture"], attack_cfgs),
        "victims": (
            f"{n_victims} (validation image v x {settings['capture']['victim_stride']},"
            " wrapped around the validation set)"
        ),
        "threat model": settings["threat_model"],
        **{
            f"attack {a}": {k: v for k, v in cfg.items() if k not in ("kind", "label")}
            for a, cfg in attack_cfgs.items()
        },
        # a defense's own settings against a malicious server's attack (DCS² against Imprint)
        **{
            f"defense {d} against {kind}": values
            for d, block in settings["defenses"].items()
            for kind, values in block.get("against", {}).items()
        },
        "seed": settings["seed"],
    }
    protecting = [  # DCS²: a table with it scores every defense on the same samples
        d
        for d, block in settings["defenses"].items()
        if fact("defenses", block["kind"], "protects_samples_by")
    ]
    if protecting:
        setting["samples scored"] = (
            "every sample of each batch, under every defense (scored: batch)"
            if scores_whole_batch(spec)
            else f"the samples {', '.join(protecting)} protects, under every defense "
            "(scored: sensitive)"
        )
    reference = spec["reference"]
    note = ""
    if settings["scale"] == "embedded":
        cap = settings["capture"]
        runs = "; ".join(
            f"{attack_cfgs[a]['label']}: {_budgets({m: by_model[m][a] for m in models})}"
            for a in spec["attacks"]
        )
        note = (
            f"{spec['scaled_down_note'].strip()} This run: {n_victims} victims, "
            f"batch size {_batch_sizes(cap, attack_cfgs)}, round(s) "
            f"{', '.join(map(str, rounds))}; {runs}."
        )
    render_table(
        name,
        metric_files,
        out_dir,
        attacks=spec["attacks"],
        defenses=spec["defenses"],
        datasets=spec["datasets"],
        setting=setting,
        scaled_down_note=note,
        reference_csv=project_path(reference) if reference else None,
        no_reference=spec.get("no_reference", ""),
        title=spec["title"],
        reproduces=spec["title"].split(":")[0],
        rows=rows,
        metrics=spec.get("metrics", DEFAULT_METRICS),
        sweep=sweep,
        tradeoff=_tradeoff(spec.get("tradeoff"), settings),
        training=_training(spec, summaries, settings),
        models=models,
        shared={d: (run, labels[d]) for d, run in shared.items()},
        shared_attacks=shared_attacks,
        undefended_files=undefended,
    )
    shown: dict[str, list[str]] = {}  # each run's grid rows: the table's defenses that read it
    for d in spec["defenses"]:
        shown.setdefault(shared.get(d, d), []).append(labels[d])
    shown_attacks: dict[tuple[str, str], list[str]] = {}  # and the attacks that read it
    for run, attacks in settings["shared_attacks"].items():
        for a in spec["attacks"]:
            shown_attacks.setdefault((run, attacks.get(a, a)), []).append(attack_labels[a])
    _grid(
        metric_files,
        out_dir / "figures" / f"{name}_grid.png",
        rounds,
        several_models=len(models) > 1,
        shown=shown,
        shown_attacks=shown_attacks,
        caption=figure_caption(
            f"{spec['title']}: reconstructions", settings["scale"], f"{name}.md"
        ),
    )


def _training(
    spec: dict[str, Any], summaries: Sequence[Path], settings: dict[str, Any]
) -> dict[str, dict[tuple[str, str, str], tuple[dict[int, float], str]]]:
    """The table's metrics of scope ``training`` (accuracy, PMM) from the utility runs."""
    from gradinv.stages.utility import training_metrics
    from gradinv.tables.aggregate import metric_spec

    wanted = [m for m in spec.get("metrics", DEFAULT_METRICS) if metric_spec(m).scope == "training"]
    if not wanted:
        return {}
    runs = [read_json(p) for p in summaries]
    values = training_metrics(runs, settings["utility"]["average_last"])
    return {m: values[m] for m in wanted}


def _sweep(x_axis: str | None, defenses: dict[str, Any], rounds: list[int]) -> Sweep | None:
    """The line figure's x axis: the attacked round, or a setting of the table's defenses."""
    if x_axis is None:
        return None
    if x_axis == "round":
        return Sweep("round", {r: float(r) for r in rounds}, "FL round")
    return Sweep(
        "defense",
        {d: float(cfg[x_axis]) for d, cfg in defenses.items()},
        x_axis,
        series=_families(defenses, x_axis),
    )


def _families(defenses: dict[str, Any], x_axis: str) -> dict[str, str] | None:
    """Each defense's family along the ``x_axis`` setting, named by the settings that differ
    between families (``fallback=never-raw``); None when all are one family."""
    rest = {
        d: {k: v for k, v in cfg.items() if k not in (x_axis, "label", "from")}
        for d, cfg in defenses.items()
    }
    keys = {d: repr(sorted(r.items(), key=lambda kv: kv[0])) for d, r in rest.items()}
    if len(set(keys.values())) < 2:
        return None
    differ = sorted(
        k
        for k in {k for r in rest.values() for k in r}
        if len({repr(r.get(k)) for r in rest.values()}) > 1
    )
    return {d: ", ".join(f"{k}={r.get(k)}" for k in differ) for d, r in rest.items()}


def _tradeoff(x: str | None, settings: dict[str, Any]) -> Tradeoff | None:
    """A line per sweep through its points, in the table's order of defenses (a table lists a
    sweep's variants in the order of its values); a defense outside any sweep is a point of its
    own. A sweep's line is its base defense's label, with the swept setting where the table
    sweeps that base over several settings."""
    if x is None:
        return None
    labels, points = settings["labels"]["defenses"], settings["sweep_points"]
    order = settings["table"]["defenses"]
    swept = [tuple(points[d][:2]) for d in order if d in points]
    lines = {}
    for i, d in enumerate(order):
        if d not in points:
            lines[d] = (labels[d], i)
            continue
        base, setting = points[d][:2]
        several = len({s for b, s in swept if b == base}) > 1
        lines[d] = (f"{labels[base]} ({setting} sweep)" if several else f"{labels[base]} sweep", i)
    return Tradeoff(x, lines)


def _grid(
    metric_files: list[Path],
    out: Path,
    rounds: list[int],
    *,
    caption: str,
    several_models: bool = False,
    shown: dict[str, list[str]],
    shown_attacks: dict[tuple[str, str], list[str]],
) -> None:
    """Original vs reconstructed images, one row per defense and attack (a batch's first scored
    image and the reconstruction matched to it);
    ``shown`` gives the labels a defense's runs appear under (a shared run: several), and
    ``shown_attacks`` those a (defense run, attack run)'s appear under.

    The grid is drawn from the attacks' files, which no number of the table reads (the scores
    hold those): where one is not on disk (deleted to save space, or a run carried to another
    machine without it, ``benchmarks/run_state.py``), its tiles say so, the caption counts
    them and names the command that brings them back, and the table is still written."""
    entries, not_kept, runs = [], [], 0
    rows = list(scored_runs(metric_files))
    # A table whose attacks take batches of different sizes (DCS²'s: Imprint's 4, the others'
    # 2) draws each size in rows of its own: victim v's batch, and with it the image shown as
    # its original, differs from one size to the other (batches of distinct labels share no
    # image, so a larger batch can push a victim's first image along).
    batch_sizes = {row.get("batch_size") for row in rows}
    for row in rows:
        runs += 1
        secret = load_tensors(run_path(row["victim_file"]))
        if run_path(row["reconstruction"]).is_file():
            original, reconstruction = first_scored_pair(row, load_reconstruction(row), secret)
        else:
            original, reconstruction = first_scored_original(row, secret), NOT_KEPT
            not_kept.append(row["reconstruction"])
        attack_labels = shown_attacks.get((row["defense"], row["attack"]), [row["attack_label"]])
        for label, attack_label in itertools.product(
            shown.get(row["defense"], [row["defense_label"]]), attack_labels
        ):
            entries.append(
                GridEntry(
                    dataset=row["dataset_label"]
                    + (f", batch {row['batch_size']}" if len(batch_sizes) > 1 else ""),
                    # One grid row per round too when the table spans rounds (Table V).
                    defense_label=(f"{row['model']}: " if several_models else "")
                    + label
                    + (f", round {row['round']}" if len(rounds) > 1 else ""),
                    attack_label=attack_label,
                    victim=row["victim"],
                    original=original,
                    reconstruction=reconstruction,
                )
            )
    if not_kept:
        first = not_kept[0]
        note = (
            f"{len(not_kept)} of the {runs} reconstructions are not on disk"
            f" (their attacks' files, such as {first}, were deleted or not carried "
            f"here); `snakemake {first} --cores 1` makes one again, and the next run redraws this"
        )
        print(f"gradinv report: {out.name}: {note}", file=sys.stderr)
        caption = f"{caption} {note}."
    reconstruction_grid(entries, out, caption)


def _batch_sizes(capture: dict[str, Any], attacks: dict[str, Any]) -> str:
    """A table's batch size, with the attacks that have their own (``2 (Imprint: 4)``)."""
    own = capture.get("batch_sizes", {})
    extra = ", ".join(f"{attacks[a]['label']}: {bs}" for a, bs in own.items())
    return f"{capture['batch_size']} ({extra})" if extra else str(capture["batch_size"])


def _budgets(cfgs: dict[str, dict[str, Any]]) -> str:
    """An attack's budget, or each model's where the models' ``attack_settings`` differ."""
    texts = {m: _budget(cfg) for m, cfg in cfgs.items()}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return ", ".join(f"{t} on {m}" for m, t in texts.items())


def _budget(cfg: dict[str, Any]) -> str:
    """An attack's cost per run as its own class describes it (restarts x iterations, ...)."""
    from gradinv.attacks import ATTACKS
    from gradinv.config import method_settings
    from gradinv.settings import from_mapping

    cls = ATTACKS.get(cfg["kind"])
    return cls.budget(from_mapping(cls.Settings, method_settings(cfg), where=cfg["label"]))
