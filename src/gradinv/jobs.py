"""What the workflow asks of the config: each job's settings and the files it reads.

Jobs get their settings as one JSON string (:func:`job_settings`) that Snakemake passes through
``params:``, so that changing a value reruns exactly the jobs that read it. The other functions
list a job's inputs beyond the path pattern of its rule (a generator, Refiner's evaluation
network), for the rules in ``workflow/rules/`` and DVC; a table's and the claims' are
:mod:`gradinv.table_inputs`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gradinv.adaptive import shared_attacks
from gradinv.config import (
    COMMON,
    defense_block,
    merge,
    method_settings,
    recipe_partition,
    table_batch_size,
    table_models,
    table_rounds,
    table_victims,
)
from gradinv.cross_checks import attack_generator
from gradinv.methods import fact
from gradinv.paths import evaluation_network_path, generator_path
from gradinv.sweeps import shared_runs, sweep_points, table_runs
from gradinv.table_inputs import (
    claim_tables,
    scored_on,
    table_utility_runs,
    trained_datasets,
)


def attack_block(
    config: dict[str, Any], attack: str, dataset: str, model: str | None = None
) -> dict[str, Any]:
    """Attack ``attack``'s settings on ``dataset`` and ``model``: its block, with the
    ``attack_settings`` its generator gives for its kind (GIFD's radii for StyleGAN2, say), then
    those the model gives (more IG iterations on LeNet than on the 3-layer CNN, say)."""
    block = dict(config["attacks"][attack])
    name = attack_generator(config, attack, dataset)
    if name is not None:
        block |= config["generators"][name].get("attack_settings", {}).get(block["kind"], {})
    if model is not None:
        block |= config["models"][model].get("attack_settings", {}).get(block["kind"], {})
    return block


def model_block(config: dict[str, Any], model: str) -> dict[str, Any]:
    """A model's block without what it says of the attacks on it (``attack_settings``), so that
    changing those reruns the attacks and not the training."""
    return {k: v for k, v in config["models"][model].items() if k != "attack_settings"}


def attack_generator_file(config: dict[str, Any], attack: str, dataset: str) -> list[str]:
    """The generator file an attack job reads (empty for an attack without a generator)."""
    name = attack_generator(config, attack, dataset)
    if name is None:
        return []
    return [generator_path(name, config["generators"][name], dataset)]


def defense_assets(config: dict[str, Any], defense: str, dataset: str) -> list[str]:
    """The files a client running ``defense`` reads besides the model and its data: Refiner's
    evaluation network (rules train, capture, train_utility and the convergence study)."""
    if fact("defenses", config["defenses"][defense]["kind"], "needs_evaluation_network"):
        return [evaluation_network_path(dataset)]
    return []


def metric_assets(config: dict[str, Any], dataset: str) -> list[str]:
    """The files the score stage reads to compute ``metrics.names``: the evaluation network of
    the noise_ratio metric, unless ``metrics.evaluation_network`` names one."""
    metrics = config["metrics"]
    if "noise_ratio" in metrics["names"] and not metrics["evaluation_network"]:
        return [evaluation_network_path(dataset)]
    return []


def evaluation_network_files(config: dict[str, Any]) -> list[str]:
    """Every evaluation network the tables and training studies read (dvc.yaml's `evalnet`)."""
    files = set()
    for spec in config["tables"].values():
        for dataset in spec["datasets"]:
            files.update(metric_assets(config, dataset))
            for defense in spec["defenses"]:
                files.update(defense_assets(config, defense, dataset))
    conv = config["convergence"]
    for study, defenses in (
        (config["utility"], config["utility"]["defenses"]),
        (conv, [*conv["defenses"], *conv["clients_defenses"]]),
    ):
        for defense in defenses:
            files.update(defense_assets(config, defense, study["dataset"]))
    return sorted(files)


def malicious_attacks(config: dict[str, Any]) -> list[str]:
    """The attacks whose server changes the model it sends (Imprint): each has its own capture."""
    return [
        name
        for name, block in config["attacks"].items()
        if fact("attacks", block["kind"], "server") == "malicious"
    ]


def victim_groups(n: int, per_job: int) -> list[tuple[int, int]]:
    """The attack jobs behind a cell's first ``n`` victims, as (first, last) victims: runs of
    ``per_job`` (params.yaml ``victims_per_job``), the last one shorter when ``per_job`` does not
    divide ``n``. Victim v's seed and result do not depend on the grouping."""
    if n < 0 or per_job < 1:
        raise ValueError(f"victim_groups needs n >= 0 and per_job >= 1, got {n} and {per_job}")
    return [(first, min(first + per_job, n) - 1) for first in range(0, n, per_job)]


def _attack_kind(config: dict[str, Any], w: Any) -> str | None:
    """The kind of the attack a job's wildcards name (a malicious capture's, a score's), else
    None. Only a malicious server's kind can have a defense's ``against`` entry (the config check
    refuses any other), so :func:`defense_block` changes nothing for an honest attack's jobs."""
    attack = w.get("attack")
    return None if attack is None else str(config["attacks"][attack]["kind"])


def capture_file(config: dict[str, Any], w: Any) -> str:
    """The capture file of victims ``w.first`` to ``w.last`` an attack job reads: the honest
    server's, shared by every honest attack, or its own for a malicious attack (made on the model
    it changed)."""
    run = f"results/captures/{w.dataset}/{w.model}/{w.defense}/r{w.round}_b{w.bs}"
    victims = f"victims{w.first}-{w.last}.pt"
    if w.attack in malicious_attacks(config):
        return f"{run}/{w.attack}/{victims}"
    return f"{run}/{victims}"


def generator_names(config: dict[str, Any], trained: bool) -> str:
    """A wildcard pattern of the generators that are trained here (or fetched), for the rules."""
    names = [
        name
        for name, block in config.get("generators", {}).items()
        if fact("generators", block["kind"], "trainable") == trained
    ]
    return "|".join(map(re.escape, names)) if names else "(?!)"


def prepared_files(config: dict[str, Any]) -> list[str]:
    """Every dataset the pipeline trains on (the tables', the utility and the convergence
    studies'), prepared, and every client partition: each dataset's, the convergence study's and
    each recipe's own on each dataset it trains (dvc.yaml's `data` stage, which owns
    ``data/prepared`` and ``data/partitions`` whole: the partitions are versioned with the data,
    so that a clone that pulls the generators and checkpoints also pulls the partitions they were
    made from, and no later stage writes into an out of this one)."""
    utility, convergence = config["utility"]["dataset"], config["convergence"]["dataset"]
    tables = config["tables"].values()
    datasets = sorted({d for spec in tables for d in spec["datasets"]} | {utility, convergence})
    own = {
        recipe_partition_file(config, recipe, d)
        for recipe, trained in trained_datasets(config).items()
        for d in trained
    }
    partitions = [f"data/partitions/{d}.json" for d in datasets]
    return [
        *(f"data/prepared/{d}.pt" for d in datasets),
        *partitions,
        f"data/partitions/{convergence}.convergence.json",
        *sorted(own - set(partitions)),
    ]


def generator_files(config: dict[str, Any]) -> list[str]:
    """Every generator file the tables' attacks read (dvc.yaml's `generators` stage)."""
    return sorted(
        {
            path
            for spec in config["tables"].values()
            for attack in spec["attacks"]
            for dataset in spec["datasets"]
            for path in attack_generator_file(config, attack, dataset)
        }
    )


def run_labels(config: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each defense's and attack's label (the paper's name), by run key."""
    return {
        kind: {k: block["label"] for k, block in config[kind].items()}
        for kind in ("defenses", "attacks")
    }


def job_settings(config: dict[str, Any], stage: str, **w: str) -> str:
    """The settings a job of ``stage`` reads, as canonical JSON (Snakemake's rerun trigger).

    Only what changes a result is here. How a job runs (threads, the MLflow experiment, the
    progress interval) reaches it through the environment, so changing it reruns nothing.
    """
    common = {
        "seed": config["seed"],
        "scale": config["scale"],
        "device": config["device"],
    }
    if stage == "prepare":
        src = config["data"]["sources"][w["dataset"]]
        out = {"dataset": w["dataset"], "settings": method_settings(src), "seed": config["seed"]}
        return _dump(out)
    if stage == "generator":
        return _dump(
            {
                **common,
                "generator_name": w["generator"],
                "generator": config["generators"][w["generator"]],
                "dataset": w.get("dataset"),
                "partition": config["partition"],
            }
        )
    if stage == "floor":
        return _dump({**common, "dataset": w["dataset"], "partition": config["partition"]})
    if stage == "evalnet":
        return _dump(
            {
                **common,
                "evaluation_network": method_settings(config["evaluation_network"]),
                "dataset": w["dataset"],
                "partition": config["partition"],
            }
        )
    if stage == "partition":
        return _dump({"partition": config["partition"], "seed": config["seed"]})
    if stage == "convergence_partition":
        return _dump({"partition": config["convergence"]["partition"], "seed": config["seed"]})
    if stage == "recipe_partition":
        return _dump({"partition": recipe_partition(config, w["recipe"]), "seed": config["seed"]})
    out = dict(common)
    if stage == "convergence_train":
        # The train stage's settings with the study's partition and FL setting (Figs. 7-8).
        out = json.loads(job_settings(config, "train", **w))
        out["partition"] = config["convergence"]["partition"]
        out["fl"] = convergence_fl(config, int(w["k"]))
        out["study"] = f"convergence k={w['k']}"
        return _dump(out)
    if stage == "utility_train":
        # The train stage's settings with a recipe's FL setting (the utility study's, or a
        # paper's own), the run's seed and one final model.
        run = {k: v for k, v in w.items() if k not in ("seed", "recipe")}
        out = json.loads(job_settings(config, "train", **run))
        recipe = w.get("recipe", COMMON)
        out["fl"] = utility_fl(config, recipe)
        out["partition"] = recipe_partition(config, recipe)
        out["seed"] = int(w["seed"])  # the run's seed, one of utility.seeds
        out["study"] = f"utility, recipe {recipe}, seed {w['seed']}"
        return _dump(out)
    if stage == "utility_report":
        recipe = w.get("recipe", COMMON)
        study = dict(config["utility"])
        if recipe != COMMON:  # a paper's recipe: its own defenses, label and source
            own = config["recipes"][recipe]
            study |= {
                "defenses": own["defenses"],
                "title": f"{study['title']}, under {own['label']}",
                "recipe": own,
            }
        return _dump(
            {
                **common,
                "utility": study,
                "recipe_name": recipe,
                "fl": utility_fl(config, recipe),
                "partition": recipe_partition(config, recipe),
                "defenses": {d: defense_block(config, d) for d in study["defenses"]},
            }
        )
    if stage == "convergence_official":
        # The train stage's settings with the loop of CENSOR's official code (no partition).
        out = json.loads(job_settings(config, "train", **w))
        loop = dict(config["convergence"]["official_loop"])
        del loop["defenses"]
        out["official_loop"] = {**loop, "eval_samples": config["fl"]["eval_samples"]}
        out["partition"] = None
        out["fl"] = None
        out["study"] = "convergence, official code's loop"
        return _dump(out)
    if stage == "public_report":
        spec = config["tables"]["fig10_public"]
        public = [d for d in spec["defenses"] if config["defenses"][d].get("source") == "public"]
        return _dump(
            {
                **common,
                "title": spec["title"],
                "public_defense": public[0] if public else None,
                "defenses": {d: defense_block(config, d) for d in spec["defenses"]},
            }
        )
    if stage == "claims":
        tables = config["tables"]
        return _dump(
            {
                **common,
                "tables": claim_tables(config),
                # the published numbers, to check each claim's encoding on the paper's own table
                "references": {
                    t: spec["reference"] for t, spec in tables.items() if spec["reference"]
                },
                # the runs each published table's names are matched among (a label may name
                # a defense of another table too: DCS² and its one-sensitive-sample variant)
                "reference_runs": {
                    t: {"defenses": spec["defenses"], "attacks": spec["attacks"]}
                    for t, spec in tables.items()
                    if spec["reference"]
                },
                "labels": run_labels(config),
            }
        )
    if stage == "client_time":
        # A train job's settings (model, defense, its evaluation network) with the study's.
        out = json.loads(job_settings(config, "train", **w))
        del out["partition"]  # the batch is the training split's, not a client's
        return _dump(out | {"client_time": config["client_time"]})
    if stage == "client_time_report":
        study = config["client_time"]
        return _dump(
            {
                **common,
                "client_time": study,
                "labels": run_labels(config)["defenses"],
                "models": {m: model_block(config, m) for m in study["models"]},
            }
        )
    if stage == "frontier":
        return _dump(
            {
                **common,
                "sweep_points": sweep_points(config),
                "labels": run_labels(config)["defenses"],
            }
        )
    if stage == "convergence_report":
        conv = config["convergence"]
        return _dump(
            {
                **common,
                "convergence": conv,
                "fl": convergence_fl(config, convergence_curves_k(config)),
                "labels": {d: config["defenses"][d]["label"] for d in config["defenses"]},
                "defenses": {
                    d: defense_block(config, d)
                    for d in {
                        *conv["defenses"],
                        *conv["clients_defenses"],
                        *conv.get("official_loop", {}).get("defenses", []),
                    }
                },
            }
        )
    if stage in ("train", "capture"):
        out |= {
            "model": model_block(config, w["model"]),
            "model_name": w["model"],
            # against a malicious server's attack, the defense's settings against it (its own
            # capture job); every other job's without them
            "defense": defense_block(config, w["defense"], _attack_kind(config, w)),
            "defense_name": w["defense"],
            "partition": config["partition"],
            "dataset": w["dataset"],
            "dataset_label": config["data"]["sources"][w["dataset"]]["label"],
        }
        # Refiner's evaluation network, only for a defense that reads one (so that adding it
        # reruns no other defense's jobs)
        for path in defense_assets(config, w["defense"], w["dataset"]):
            out["evaluation_network"] = path
    if stage == "train":
        out["fl"] = config["fl"]
    elif stage == "capture":
        out |= {
            "fl": config["fl"],
            "threat_model": config["threat_model"],
            "capture": config["capture"],
        }
        if "attack" in w:  # a malicious server's capture: the model its attack changed
            block = config["attacks"][w["attack"]]
            fields = fact("attacks", block["kind"], "modification_fields")
            out["malicious"] = {"kind": block["kind"]} | {f: block[f] for f in fields if f in block}
    elif stage == "attack":
        out |= {
            # with what the model's block says of this kind of attack (its attack_settings)
            "attack": attack_block(config, w["attack"], w.get("dataset", ""), w.get("model")),
            "attack_name": w["attack"],
            "threat_model": config["threat_model"],
        }
        name = attack_generator(config, w["attack"], w.get("dataset", ""))
        if name is not None:
            out |= {
                "generator_name": name,
                "generator": config["generators"][name],
                "dataset": w["dataset"],
            }
    elif stage == "score":
        out |= {
            "metrics": config["metrics"],
            "attack": attack_block(config, w["attack"], w["dataset"], w["model"]),
            "attack_name": w["attack"],
            "defense": defense_block(config, w["defense"], _attack_kind(config, w)),
            "defense_name": w["defense"],
            "dataset": w["dataset"],
            "dataset_label": config["data"]["sources"][w["dataset"]]["label"],
            "threat_model": config["threat_model"],
        }
        # a table with DCS² scores its other defenses on DCS²'s sensitive samples (absent: the
        # whole batch, and the settings of every other score job stay as they were)
        cell = (w["dataset"], w["model"], w["defense"], w["round"], w["bs"], w["attack"])
        on = scored_on(config, cell)
        if on is not None:
            out["scored_on"] = on
    elif stage == "table":
        table = config["tables"][w["table"]]
        if table_utility_runs(config, w["table"]):  # the table shows accuracy or PMM
            recipe = table.get("recipe", COMMON)
            out["utility"] = {"fl": utility_fl(config, recipe), **config["utility"]}
        if "tradeoff" in table:  # its figure draws a line per sweep
            points = sweep_points(config)
            out["sweep_points"] = {d: points[d] for d in table["defenses"] if d in points}
        shared = shared_runs(config)
        # the sweep points read from their base's runs (the report shows them under each name)
        out["shared_runs"] = {d: shared[d] for d in table["defenses"] if d in shared}
        # so do the adaptive attacks with nothing to adapt to, from the plain attack's
        out["shared_attacks"] = {
            run: shared_attacks(config, run, table["attacks"])
            for run in table_runs(config, w["table"])
        }
        out |= {
            "table": table,
            "table_name": w["table"],
            "labels": run_labels(config),
            "attacks": config["attacks"],
            "defenses": {
                d: config["defenses"][d] for d in config["tables"][w["table"]]["defenses"]
            },
            "rounds": table_rounds(config, w["table"]),
            "victims": table_victims(config, w["table"]),
            "models": {m: model_block(config, m) for m in config["models"]},
            # each attack as it runs on each of the table's models (the budgets in its notes)
            "attacks_by_model": {
                m: {a: attack_block(config, a, table["datasets"][0], m) for a in table["attacks"]}
                for m in table_models(config, w["table"])
            },
            "capture": {**config["capture"], **_table_batch_sizes(config, w["table"])},
            "fl": config["fl"],
            "threat_model": config["threat_model"],
        }
    else:
        raise ValueError(f"no job settings for stage {stage!r}")
    return _dump(out)


def _table_batch_sizes(config: dict[str, Any], table: str) -> dict[str, Any]:
    """A table's batch size, and the attacks' that differ from it (``batch_sizes``, only where
    some do: every other table's settings stay as they were)."""
    bs = table_batch_size(config, table)
    own = {
        a: table_batch_size(config, table, a)
        for a in config["tables"][table]["attacks"]
        if table_batch_size(config, table, a) != bs
    }
    return {"batch_size": bs, **({"batch_sizes": own} if own else {})}


def convergence_fl(config: dict[str, Any], clients_per_round: int) -> dict[str, Any]:
    """``fl`` updated with ``convergence.fl``, ``clients_per_round`` and a final checkpoint."""
    fl = merge(config["fl"], config["convergence"]["fl"])
    fl["clients_per_round"] = clients_per_round
    fl["checkpoint_rounds"] = [fl["rounds"]]
    return fl


def utility_fl(config: dict[str, Any], recipe: str = COMMON) -> dict[str, Any]:
    """``fl`` updated with a recipe's (the common one: ``utility.fl``; a paper's:
    ``recipes.<name>.fl``) and a checkpoint after the last round only."""
    own = config["utility"]["fl"] if recipe == COMMON else config["recipes"][recipe]["fl"]
    fl = merge(config["fl"], own)
    fl["checkpoint_rounds"] = [fl["rounds"]]
    return fl


def recipe_partition_file(config: dict[str, Any], recipe: str, dataset: str) -> str:
    """The partition file a recipe's runs read: the dataset's, or the recipe's own."""
    if recipe != COMMON and config["recipes"][recipe].get("partition"):
        return f"data/partitions/{dataset}.{recipe}.json"
    return f"data/partitions/{dataset}.json"


def convergence_curves_k(config: dict[str, Any]) -> int:
    """Clients per round of the Figs. 7-8 curves: ``convergence.fl``, else ``fl``."""
    return int(merge(config["fl"], config["convergence"]["fl"])["clients_per_round"])


def _dump(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
