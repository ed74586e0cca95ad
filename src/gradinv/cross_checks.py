"""What the schema cannot say about ``params.yaml``: names one section uses that another must
define, values that are each valid but cannot work together, and the generator each generative
attack searches. :func:`gradinv.config.validate` runs the checks after the schema, so every error
still names the key and the fix.
"""

from __future__ import annotations

import difflib
from typing import Any

from gradinv.config import (
    COMMON,
    REPO_ROOT,
    merge,
    method_settings,
    project_root,
    recipe_partition,
    table_batch_sizes,
    table_models,
    table_rounds,
    table_victims,
)
from gradinv.settings import ConfigError


def victim_start(victim: int, stride: int, pool: int) -> int:
    """The validation image victim ``victim``'s batch starts at: ``victim * stride``, wrapped
    around the ``pool`` validation images, so that a table may attack more victims than one pass
    of the stride holds (CENSOR's patches: 16 victims at stride 93 fill one pass of 1500 images;
    victims 16 on start at 1488, 81, 174, ..., between those of the first pass). The victims of
    one pass keep their images whatever a table's count."""
    return victim * stride % pool


def victim_clash(victims: int, stride: int, batch_size: int, pool: int) -> str:
    """Why ``victims`` consecutive batches of ``batch_size`` images (victim v's from
    :func:`victim_start` on) do not fit ``pool`` validation images, or "" when each fits and no
    two share an image. (With distinct labels a batch may reach past its ``batch_size``
    images; :func:`gradinv.stages.capture.victim_indices` says so when it runs out.)"""
    starts = sorted((victim_start(v, stride, pool), v) for v in range(victims))
    for (a, va), (b, vb) in zip(starts, [*starts[1:], (pool, None)], strict=True):
        if b - a < batch_size:
            if vb is None:
                return f"victim {va} needs validation images {a}..{a + batch_size - 1}"
            return f"victims {va} and {vb} share validation images from {b} on"
    return ""


def check_references(config: dict[str, Any], source: str) -> None:
    """Names used in ``tables`` must be defined in their sections."""
    for name, sweep in config.get("sweeps", {}).items():
        block, setting = config["defenses"][sweep["defense"]], sweep["setting"]
        if setting not in block or setting in ("kind", "label"):
            settings = ", ".join(k for k in block if k not in ("kind", "label"))
            raise ConfigError(
                f"{source}: sweeps.{name}.setting: {setting!r} is not a setting of defense "
                f"{sweep['defense']!r} (its settings: {settings})."
            )
    for table, spec in config["tables"].items():
        if not spec["defenses"]:
            raise ConfigError(
                f"{source}: tables.{table}: no defenses; list some under defenses or sweeps."
            )
        for key, section in (
            ("datasets", config["data"]["sources"]),
            ("defenses", config["defenses"]),
            ("attacks", config["attacks"]),
        ):
            for name in spec[key]:
                if name not in section:
                    close = difflib.get_close_matches(name, section, n=1)
                    hint = f" Did you mean {close[0]!r}?" if close else ""
                    where = "data.sources" if key == "datasets" else key
                    raise ConfigError(
                        f"{source}: tables.{table}.{key}: {name!r} is not defined "
                        f"under {where}.{hint}"
                    )
        for model in table_models(config, table):
            if model not in config["models"]:
                raise ConfigError(
                    f"{source}: tables.{table}.model: {model!r} is not defined under models."
                )
        recipe, recipes = spec.get("recipe", COMMON), config.get("recipes", {})
        if recipe != COMMON and recipe not in recipes:
            close = difflib.get_close_matches(recipe, recipes, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{source}: tables.{table}.recipe: {recipe!r} is not defined under recipes.{hint}"
            )
    study = config.get("client_time")
    if study:
        # paper_models may name a model the overlay does not time, but a defined one
        for key, section in (
            ("models", "models"),
            ("defenses", "defenses"),
            ("paper_models", "models"),
        ):
            for name in study.get(key) or ():
                if name not in config[section]:
                    close = difflib.get_close_matches(name, config[section], n=1)
                    hint = f" Did you mean {close[0]!r}?" if close else ""
                    raise ConfigError(
                        f"{source}: client_time.{key}: {name!r} is not defined under "
                        f"{section}.{hint}"
                    )
    from gradinv.attacks import ATTACKS
    from gradinv.defenses import defense_settings
    from gradinv.methods import fact
    from gradinv.settings import from_mapping

    malicious = [k for k in ATTACKS if fact("attacks", k, "server") == "malicious"]
    for name, block in config["defenses"].items():  # combinations a defense's settings refuse
        defense_settings(block["kind"], method_settings(block), where=f"{source}: defenses.{name}")
        for kind, values in block.get("against", {}).items():
            where = f"{source}: defenses.{name}.against.{kind}"
            if kind not in malicious:
                raise ConfigError(
                    f"{where}: {kind!r} is not the kind of a malicious server's attack, the only "
                    "attacks whose capture is their own (an honest server's attacks share one "
                    f"update); use one of {', '.join(malicious)}, or a defense block of its own."
                )
            defense_settings(block["kind"], method_settings(block | values), where=where)
    blocks = [
        *((f"generators.{n}", b) for n, b in config.get("generators", {}).items()),
        *((f"models.{n}", b) for n, b in config["models"].items()),
    ]
    for owner, block in blocks:
        for kind, values in block.get("attack_settings", {}).items():
            where = f"{owner}.attack_settings.{kind}"
            if kind not in ATTACKS:
                raise ConfigError(f"{source}: {where}: {kind!r} is not an attack kind.")
            from_mapping(ATTACKS.get(kind).Settings, values, where=where)
    for name, block in config.get("generators", {}).items():
        for dataset in block["datasets"]:
            if dataset not in config["data"]["sources"]:
                raise ConfigError(
                    f"{source}: generators.{name}.datasets: {dataset!r} is not defined under "
                    "data.sources."
                )
    for table, spec in config["tables"].items():
        for attack in spec["attacks"]:
            for dataset in spec["datasets"]:
                attack_generator(config, attack, dataset, source)
        for attack in spec.get("batch_sizes", {}):
            if attack not in spec["attacks"]:
                raise ConfigError(
                    f"{source}: tables.{table}.batch_sizes: {attack!r} is not one of the "
                    f"table's attacks ({', '.join(spec['attacks'])}); name one of them, or "
                    "remove it."
                )
    conv = config["convergence"]
    official = conv.get("official_loop", {})
    # The two training studies: their dataset and model, their FL keys, their defenses.
    studies = {
        "convergence": (
            conv,
            {
                "defenses": conv["defenses"],
                "clients_defenses": conv["clients_defenses"],
                "official_loop.defenses": official.get("defenses", []),
            },
        ),
        "utility": (config["utility"], {"defenses": config["utility"]["defenses"]}),
    }
    for study_name, (study, defense_lists) in studies.items():
        for key, section, where in (
            ("dataset", config["data"]["sources"], "data.sources"),
            ("model", config["models"], "models"),
        ):
            if study[key] not in section:
                raise ConfigError(
                    f"{source}: {study_name}.{key}: {study[key]!r} is not defined under {where}."
                )
        unknown = sorted(set(study["fl"]) - set(config["fl"]))
        if unknown:
            close = difflib.get_close_matches(unknown[0], config["fl"], n=1)
            hint = (
                f" Did you mean {close[0]!r}?" if close else f" Allowed: {', '.join(config['fl'])}."
            )
            raise ConfigError(f"{source}: {study_name}.fl.{unknown[0]}: unknown key.{hint}")
        for key, names in defense_lists.items():
            for name in names:
                if name not in config["defenses"]:
                    close = difflib.get_close_matches(name, config["defenses"], n=1)
                    hint = f" Did you mean {close[0]!r}?" if close else ""
                    raise ConfigError(
                        f"{source}: {study_name}.{key}: {name!r} is not defined under "
                        f"defenses.{hint}"
                    )


def attack_generator(
    config: dict[str, Any], attack: str, dataset: str, source: str = "params.yaml"
) -> str | None:
    """The generator attack ``attack`` searches on ``dataset``: its ``generator`` setting, else
    the one generator whose ``datasets`` list ``dataset``; None for an attack without one."""
    from gradinv.methods import fact

    block = config["attacks"][attack]
    if not fact("attacks", block["kind"], "generative"):
        return None
    generators = config.get("generators", {})
    chosen = block.get("generator", "")
    if chosen:
        if chosen not in generators:
            close = difflib.get_close_matches(chosen, generators, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{source}: attacks.{attack}.generator: {chosen!r} is not defined under "
                f"generators.{hint}"
            )
        if dataset not in generators[chosen]["datasets"]:
            raise ConfigError(
                f"{source}: attacks.{attack}.generator: {chosen} does not serve {dataset} "
                f"(its datasets: {generators[chosen]['datasets']}); add {dataset} to them or "
                "choose another generator."
            )
        return chosen
    serving = [name for name, g in generators.items() if dataset in g["datasets"]]
    if len(serving) != 1:
        what = "no generator" if not serving else f"several generators ({', '.join(serving)})"
        raise ConfigError(
            f"{source}: attack {attack} searches a generator's latent space, but {what} list "
            f"{dataset} under generators.<name>.datasets; list it under exactly one, or set "
            f"attacks.{attack}.generator."
        )
    return serving[0]


def check_combinations(config: dict[str, Any], source: str) -> None:
    """Values that are each valid but cannot work together."""
    check_datasets(config, source)
    from gradinv.cluster import LOCAL_RULES, REMOTE_RULES

    for rule in config["cluster"]["resources"]:
        if rule != "default" and rule not in REMOTE_RULES:
            local = " (it runs on the submit host)" if rule in LOCAL_RULES else ""
            close = difflib.get_close_matches(rule, REMOTE_RULES, n=1)
            hint = f" Did you mean {close[0]!r}?" if close and not local else ""
            raise ConfigError(
                f"{source}: cluster.resources.{rule}: no rule {rule!r} is submitted to a "
                f"scheduler{local}; use default or one of {', '.join(REMOTE_RULES)}.{hint}"
            )
    fl, cap, threat = config["fl"], config["capture"], config["threat_model"]

    def fail(message: str) -> None:
        raise ConfigError(f"{source}: {message}")

    from gradinv.methods import STOCHASTIC

    for name, attack in config["attacks"].items():
        for key in ("layers", "ignore_layers"):
            special = [p for p in attack.get(key, ()) if p.startswith("@") and p != STOCHASTIC]
            if special:
                fail(
                    f"attacks.{name}.{key}: {special[0]!r} is no layer pattern; the only one "
                    f"starting with @ is {STOCHASTIC!r} (the layers after a random draw)."
                )
    recipes = config.get("recipes", {})
    for name, recipe in recipes.items():
        unknown = [d for d in recipe["defenses"] if d not in config["defenses"]]
        if unknown:
            fail(f"recipes.{name}.defenses: {unknown[0]!r} is not defined under defenses.")
        if "none" not in recipe["defenses"]:
            fail(f"recipes.{name}.defenses: list none, the reference every other is relative to.")
    partition = config["partition"]
    for where, settings, clients in (
        ("fl", fl, partition),
        ("utility.fl", merge(fl, config["utility"]["fl"]), partition),
        (
            "convergence.fl",
            merge(fl, config["convergence"]["fl"]),
            config["convergence"]["partition"],
        ),
        *(
            (f"recipes.{n}.fl", merge(fl, r["fl"]), merge(partition, r.get("partition", {})))
            for n, r in recipes.items()
        ),
    ):
        defended = settings.get("defended_clients", "all")
        beyond = [] if defended == "all" else [c for c in defended if c >= clients["num_clients"]]
        if beyond:
            fail(
                f"{where}.defended_clients: client {beyond[0]} is not one of the partition's "
                f"{clients['num_clients']} clients (0 to {clients['num_clients'] - 1}); name "
                "clients of the partition, or all"
            )
        fedavg_only = {
            "client_optimizer": "sgd",
            "momentum": 0.0,
            "local_epochs": 0,
            "lr_decay": 1.0,
        }
        changed = [k for k, v in fedavg_only.items() if settings.get(k, v) != v]
        if settings["protocol"] == "fedsgd" and changed:
            fail(
                f"{where}.{changed[0]}: a FedAvg client's setting, but the protocol is fedsgd "
                "(the server steps by -lr x the mean gradient; no client optimizer runs): set "
                f"{where}.protocol: fedavg, or leave {changed[0]} at its default"
            )
    if max(fl["checkpoint_rounds"]) > fl["rounds"]:
        fail(
            f"fl.checkpoint_rounds: round {max(fl['checkpoint_rounds'])} is beyond fl.rounds "
            f"({fl['rounds']}); raise fl.rounds or drop that round."
        )
    if cap["round"] not in fl["checkpoint_rounds"]:
        fail(
            f"capture.round: round {cap['round']} has no checkpoint; add it to "
            f"fl.checkpoint_rounds ({fl['checkpoint_rounds']})."
        )
    if fl["clients_per_round"] > config["partition"]["num_clients"]:
        fail(
            f"fl.clients_per_round: {fl['clients_per_round']} clients per round, but "
            f"partition.num_clients is {config['partition']['num_clients']}; lower one or "
            "raise the other."
        )
    fig10 = config["tables"].get("fig10_public")
    if fig10 and not any(
        config["defenses"][d].get("source") == "public" for d in fig10["defenses"]
    ):
        fail(
            "tables.fig10_public.defenses: Fig. 10 needs a defense with source: public (CENSOR "
            "drawing its directions from public images); add one, e.g. censor_public."
        )
    conv = config["convergence"]
    too_many = [k for k in conv["clients_per_round"] if k > conv["partition"]["num_clients"]]
    if too_many:
        fail(
            f"convergence.clients_per_round: {too_many[0]} clients per round, but "
            f"convergence.partition.num_clients is {conv['partition']['num_clients']}; lower one "
            "or raise the other."
        )
    batched = [t for t in config["tables"] if table_batch_sizes(config, t)[-1] > 1]
    if threat["labels"] == "infer" and threat["label_rule"] == "idlg" and batched:
        fail(
            f"threat_model.label_rule: idlg recovers the label of one image, but "
            f"tables.{batched[0]} attacks batches of {table_batch_sizes(config, batched[0])[-1]}; "
            "use label_rule yin (or auto)."
        )
    from gradinv.data import DATASETS
    from gradinv.settings import from_mapping

    for table, spec in config["tables"].items():
        for rnd in table_rounds(config, table):
            if rnd not in fl["checkpoint_rounds"]:
                fail(
                    f"tables.{table}.rounds: round {rnd} has no checkpoint; add it to "
                    f"fl.checkpoint_rounds ({fl['checkpoint_rounds']})."
                )
        tradeoff = spec.get("tradeoff")
        if tradeoff is not None and tradeoff not in spec.get("metrics", ()):
            fail(
                f"tables.{table}.tradeoff: {tradeoff!r} is the figure's x axis but not one of the "
                f"table's metrics; add it to tables.{table}.metrics."
            )
        x_axis = spec.get("x_axis")
        if x_axis is not None and tradeoff is not None:
            fail(f"tables.{table}: give x_axis or tradeoff (the figure's x axis), not both.")
        if x_axis is not None and x_axis != "round":
            lacking = [d for d in spec["defenses"] if x_axis not in config["defenses"][d]]
            if lacking:
                fail(
                    f"tables.{table}.x_axis: {x_axis!r} is neither 'round' nor a setting of "
                    f"defense(s) {', '.join(lacking)}; use 'round' or a setting they all have."
                )
        victims = table_victims(config, table)
        for name in spec["datasets"]:
            src = config["data"]["sources"][name]
            dataset = DATASETS.get(name)
            where = f"data.sources.{name}"
            pool = dataset.val_size(from_mapping(dataset.Settings, method_settings(src), where))
            for bs in table_batch_sizes(config, table):
                clash = pool is not None and victim_clash(victims, cap["victim_stride"], bs, pool)
                if clash:
                    fail(
                        f"capture: tables.{table} attacks {victims} victims of {bs} image(s) "
                        f"every {cap['victim_stride']} validation images of {name} (it has "
                        f"{pool}): {clash}; lower capture.victims, capture.victim_stride or the "
                        "batch size."
                    )
        reference = spec["reference"]
        roots = (project_root(), REPO_ROOT)
        if reference and not any((root / reference).is_file() for root in roots):
            fail(
                f"tables.{table}.reference: {reference} does not exist in the project; give "
                "the published numbers' CSV (a path relative to the project's folder), or "
                'reference: "" with no_reference saying why there are none.'
            )
        for model in table_models(config, table):
            if threat["bn_statistics"] and not _has_batch_norm(config["models"][model]):
                fail(
                    f"threat_model.bn_statistics: true needs batch-norm layers, but "
                    f"tables.{table}.model {model!r} has none; set it to false or use a "
                    "model with norm: batch."
                )


def _has_batch_norm(model: dict[str, Any]) -> bool:
    import torch

    from gradinv.models import build_model
    from gradinv.protocol import ModelSpec

    settings = method_settings(model)
    spec = ModelSpec(model["kind"], 10, 3, 32, settings)
    return any(isinstance(m, torch.nn.BatchNorm2d) for m in build_model(spec).modules())


def check_datasets(config: dict[str, Any], source: str) -> None:
    """What a dataset's settings yield, where it is known without the data: the patches each
    photo can give, and clients with fewer training images than a batch (a client's step would
    quietly take a smaller one)."""
    from gradinv.data import DATASETS
    from gradinv.data.partition import PartitionSettings
    from gradinv.settings import from_mapping
    from gradinv.stages.prepare import client_parts
    from gradinv.table_inputs import trained_datasets

    fl = config["fl"]
    trained = trained_datasets(config)
    trainings = [  # (where, the FL setting, the partition, the dataset(s) it trains on)
        (
            "fl",
            fl,
            "partition",
            config["partition"],
            sorted({d for t in config["tables"].values() for d in t["datasets"]}),
        ),
        (
            "utility.fl",
            merge(fl, config["utility"]["fl"]),
            "partition",
            config["partition"],
            trained[COMMON],
        ),
        *(
            (
                f"recipes.{n}.fl",
                merge(fl, r["fl"]),
                f"recipes.{n}.partition" if r.get("partition") else "partition",
                recipe_partition(config, n),
                trained[n],
            )
            for n, r in config.get("recipes", {}).items()
        ),
        (
            "convergence.fl",
            merge(fl, config["convergence"]["fl"]),
            "convergence.partition",
            config["convergence"]["partition"],
            [config["convergence"]["dataset"]],
        ),
    ]
    labels: dict[str, Any] = {}
    for name, block in config["data"]["sources"].items():
        dataset = DATASETS.get(name)
        where = f"data.sources.{name}"
        settings = from_mapping(dataset.Settings, method_settings(block), where)
        try:
            dataset.check_settings(settings)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
        labels[name] = dataset.train_labels(settings)
    smallest: dict[tuple[str, str], int] = {}
    for where, settings, pwhere, partition, datasets in trainings:
        for name in datasets:
            if labels.get(name) is None:
                continue  # known only once the data are prepared
            key = (pwhere, name)
            if key not in smallest:
                p = from_mapping(PartitionSettings, partition, pwhere)
                try:
                    clients, _ = client_parts(labels[name], p, config["seed"])
                except ValueError as err:
                    raise ConfigError(f"{source}: {pwhere}: {err}") from None
                smallest[key] = min(len(c) for c in clients)
            if smallest[key] < settings["batch_size"]:
                raise ConfigError(
                    f"{source}: {pwhere} leaves a client of {name} with {smallest[key]} training "
                    f"images, fewer than {where}.batch_size {settings['batch_size']}: its "
                    "steps would take smaller batches than the setting says; lower num_clients "
                    "or the batch size, or raise alpha."
                )
