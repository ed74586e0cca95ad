"""params.yaml is validated before anything runs; every error names the key and the fix."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gradinv.config import load, validate
from gradinv.jobs import job_settings, recipe_partition_file
from gradinv.settings import ConfigError
from gradinv.table_inputs import ACROSS, CENSOR, PAPERS, report_category, table_utility_runs

ROOT = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def broken(path: str, value=None, delete: bool = False, rename: str | None = None) -> dict:
    """A copy of params.yaml with one key changed, removed or renamed."""
    cfg = copy.deepcopy(PARAMS)
    *parents, last = path.split(".")
    node = cfg
    for key in parents:
        node = node[key]
    if rename is not None:
        node[rename] = node.pop(last)
    elif delete:
        del node[last]
    else:
        node[last] = value
    return cfg


def both(first: tuple, second: tuple) -> dict:
    """A copy of params.yaml with two keys changed (for combinations that cannot work)."""
    cfg = broken(first[0], first[1])
    *parents, last = second[0].split(".")
    node = cfg
    for key in parents:
        node = node[key]
    node[last] = second[1]
    return cfg


def test_the_shipped_params_and_overlay_are_valid():
    load(ROOT / "params.yaml")
    load(ROOT / "params.yaml", (ROOT / "workflow/configs/paper.yaml",))
    load(ROOT / "params.yaml", (ROOT / "tests/configs/tiny.yaml",))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            broken("defenses.noise.std", rename="stdd"),
            r"defenses.noise.stdd: unknown key; did you mean 'std'",
        ),
        (
            broken("attacks.ig_ignore.ignore_layers", ["@stochstic"]),
            r"attacks.ig_ignore.ignore_layers: '@stochstic' is no layer pattern; the only one starting with @ is '@stochastic'",
        ),
        (
            broken("defenses.noise.std", -0.1),
            r"defenses.noise.std: -0.1 is out of range; it must be >= 0",
        ),
        (broken("fl.rouns", 3), r"fl.rouns: unknown key; did you mean 'rounds'"),
        (broken("seed", "zero"), r"seed: 'zero' has the wrong type; expected integer"),
        (broken("capture.victims", 0), r"capture.victims: 0 is out of range; it must be >= 1"),
        (
            broken("defenses.noise.kind", "gausian_noise"),
            r"defenses.noise.kind: 'gausian_noise' is not one of .*Did you mean 'gaussian_noise'",
        ),
        (broken("attacks.ig.iterations", 2.5), r"attacks.ig.iterations: 2.5 has the wrong type"),
        (broken("attacks.ig.lr", 0), r"attacks.ig.lr: 0 is out of range; it must be > 0"),
        (broken("fl.protocol", "fedprox"), r"fl.protocol: 'fedprox' is not one of fedsgd, fedavg"),
        (broken("threat_model.labels", "guess"), r"threat_model.labels: 'guess' is not one of"),
        (
            broken("data.sources.patches.image_size", 4),
            r"data.sources.patches.image_size: 4 is out of range",
        ),
        (
            broken("data.sources.mnst", {"label": "x"}),
            r"data.sources.mnst: unknown key; did you mean 'mnist'",
        ),
        (
            broken("defenses.sparsi.prune", 1.5),
            r"defenses.sparsi.prune: 1.5 is out of range; it must be <= 1",
        ),
        (
            broken("defenses.clipping.scope", "layer"),
            r"defenses.clipping.scope: 'layer' is not one of",
        ),
        (
            broken("metrics.lpips_net", "resnet"),
            r"metrics.lpips_net: 'resnet' is not one of vgg, alex",
        ),
        (
            broken("metrics.success_ssim", 1.5),
            r"metrics.success_ssim: 1.5 is out of range; it must be <= 1",
        ),
        (
            broken("tables.table1.defenses", ["none", "sotera"]),
            r"tables.table1.defenses: 'sotera' is not defined under defenses. Did you mean 'soteria'",
        ),
        (
            broken("tables.table1.model", "vgg"),
            r"tables.table1.model: 'vgg' is not defined under models",
        ),
        (broken("scale", "huge"), r"scale: 'huge' is not one of embedded, paper"),
        (broken("partition.num_clients", -1), r"partition.num_clients: -1 is out of range"),
        (
            broken("models.resnet18.width", 4),
            r"models.resnet18.width: 4 is out of range; it must be >= 8",
        ),
        (broken("tracking", delete=True), r"'tracking' is a required property"),
        (broken("tracking.defer", "later"), r"tracking.defer: 'later' has the wrong type"),
        (
            broken("defenses.noise.label", delete=True),
            r"defenses.noise: 'label' is a required property",
        ),
        # Unknown names, with the closest valid one suggested.
        (broken("tables.table1.defenses", ["nosie"]), r"'nosie' .* Did you mean 'noise'"),
        (broken("tables.table1.attacks", ["igg"]), r"tables.table1.attacks: 'igg' .* 'ig'"),
        (broken("tables.table1.datasets", ["patchs"]), r"'patchs' .* Did you mean 'patches'"),
        (broken("models.cnn3.kind", "cnn"), r"models.cnn3.kind: 'cnn' is not one of"),
        (
            broken("attacks.ig.kind", "inverting_gradient"),
            r"attacks.ig.kind: .* Did you mean 'inverting_gradients'",
        ),
        (broken("device", "gpu"), r"device: 'gpu' is not one of cpu, cuda, auto"),
        (broken("progress.every_seconds", -5), r"progress.every_seconds: -5 is out of range"),
        # Values that are each valid but cannot work together.
        (broken("fl.checkpoint_rounds", [0, 99]), r"fl.checkpoint_rounds: round 99 is beyond"),
        (broken("capture.round", 17), r"capture.round: round 17 has no checkpoint"),
        (broken("fl.clients_per_round", 11), r"fl.clients_per_round: 11 clients per round"),
        (
            broken("capture.batch_size", 2000),
            r"capture: .* \(it has 1500\): victims 0 and 1 share validation images from 93 on; lower",
        ),
        (
            both(("threat_model.label_rule", "idlg"), ("capture.batch_size", 4)),
            r"threat_model.label_rule: idlg recovers the label of one image",
        ),
        (
            broken("threat_model.label_rule", "idlg"),
            r"idlg recovers the label of one image, but tables.table2 attacks batches of 4",
        ),
        # Variants, table options and the convergence study.
        (
            broken("defenses.censor_whole.from", "censr"),
            r"censor_whole.from: 'censr' is not defined",
        ),
        (
            both(("defenses.censor.from", "censor_whole"), ("defenses.censor.kind", "censor")),
            r"defenses.censor_whole.from: the chain censor -> censor_whole -> censor is a cycle",
        ),
        (
            broken("defenses.censor_whole.trials", 0),
            r"defenses.censor_whole.trials: 0 is out of range",
        ),
        (
            broken("fl.client_optimizer", "adam"),
            r"fl.client_optimizer: a FedAvg client's setting, but the protocol is fedsgd",
        ),
        (
            broken("utility.fl", {"rounds": 200, "lr": 0.05, "eval_every": 10, "momentum": 0.9}),
            r"utility.fl.momentum: a FedAvg client's setting",
        ),
        (
            broken("defenses.censor.fallback", "as-coded"),
            r"defenses.censor.fallback: 'as-coded' was renamed; use 'algorithm-1'",
        ),
        (
            broken("defenses.censor.fallback", "best-candidate"),
            r"defenses.censor.fallback: 'best-candidate' was renamed; use 'never-raw'",
        ),
        (
            both(
                ("defenses.censor.projection", "as-coded"),
                ("defenses.censor.subspace", "per-sample"),
            ),
            r"defenses.censor: projection as-coded is the official code's formula for one vector",
        ),
        (
            broken("tables.table5_rounds.rounds", [0, 11]),
            r"tables.table5_rounds.rounds: round 11 has no checkpoint",
        ),
        (
            broken("tables.fig9_trials.x_axis", "trails"),
            r"tables.fig9_trials.x_axis: 'trails' is neither 'round' nor a setting of defense",
        ),
        (
            broken("tables.refiner_fig6.tradeoff", "accuracy"),
            r"tables.refiner_fig6.tradeoff: 'accuracy' is the figure's x axis but not one of",
        ),
        (
            broken("tables.refiner_fig6.x_axis", "epsilon"),
            r"tables.refiner_fig6: give x_axis or tradeoff",
        ),
        (broken("tables.refiner_fig6.tradeoff", "psnr"), r"tradeoff: 'psnr' is not one of"),
        (
            broken("client_time.paper_models", {"resnet18_g": "resnet18"}),
            r"client_time.paper_models: 'resnet18_g' is not defined under models. Did you mean",
        ),
        (
            broken("tables.table3_eot.victims", 600),  # stride 93 wraps around 1500 every 500
            r"capture: tables.table3_eot attacks 600 victims .*: victims 0 and 500 share",
        ),
        (broken("convergence.fl.round", 5), r"convergence.fl.round: unknown key. Did you mean"),
        (
            broken("convergence.clients_per_round", [2, 30]),
            r"convergence.clients_per_round: 30 clients per round, but .*num_clients is 20",
        ),
        (
            broken("convergence.defenses", ["none", "censr"]),
            r"convergence.defenses: 'censr' is not defined under defenses. Did you mean 'censor'",
        ),
        (
            broken("convergence.official_loop.defenses", ["none", "censr"]),
            r"convergence.official_loop.defenses: 'censr' is not defined under defenses",
        ),
        (
            broken("convergence.official_loop.step_lr", 0),
            r"convergence.official_loop.step_lr",
        ),
        (broken("utility.fl.round", 5), r"utility.fl.round: unknown key. Did you mean"),
        (
            broken("utility.defenses", ["none", "dp_sdg"]),
            r"utility.defenses: 'dp_sdg' is not defined under defenses. Did you mean 'dp_sgd'",
        ),
        (broken("utility.model", "resnet"), r"utility.model: 'resnet' is not defined under models"),
        (
            broken("defenses.quantization.bits", 33),
            r"defenses.quantization.bits: 33 is out of range",
        ),
        (broken("defenses.cvb.kl", "bits"), r"defenses.cvb.kl"),
        (
            broken("threat_model.bn_statistics", True),
            r"threat_model.bn_statistics: true needs batch-norm layers, but .* 'cnn3' has none",
        ),
        # The generators of the generative-prior attacks.
        (broken("generators.dcgan.datasets", ["digits"]), r"no generator list patches"),
        (broken("generators.dcgan.datasets", ["patchez"]), r"generators.dcgan.datasets: 'patchez'"),
        (broken("attacks.gifd.generator", "dcgann"), r"attacks.gifd.generator: 'dcgann' .*'dcgan'"),
        (broken("generators.dcgan.kind", "dcgann"), r"generators.dcgan.kind: 'dcgann' is not one"),
        (broken("generators.dcgan.steps", 0), r"generators.dcgan.steps: 0 is out of range"),
        (broken("generators.dcgan.sha256", "abc"), r"generators.dcgan.sha256: .*does not match"),
        (
            broken("generators.dcgan.attack_settings", {"gifd": {"stagez": 2}}),
            r"generators.dcgan.attack_settings.gifd.stagez",
        ),
        (
            broken("generators.dcgan.attack_settings", {"gifx": {}}),
            r"attack_settings.gifx: 'gifx' is not an attack kind",
        ),
        (
            broken("partition.public_fraction", 1.0),
            r"partition.public_fraction: 1.0 is out of range",
        ),
    ],
)
def test_bad_configurations_fail_with_a_message_naming_the_key(cfg, message):
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_yaml_values_are_never_evaluated(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("seed: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match=r"the tag !!python/object/apply:os\.system asks"):
        load(bad)


def test_job_settings_are_canonical_and_minimal():
    a = job_settings(PARAMS, "attack", attack="ig")

    def reversed_keys(value):  # the same config written in another key order, at every level
        if isinstance(value, dict):
            return {k: reversed_keys(value[k]) for k in reversed(list(value))}
        return value

    assert job_settings(reversed_keys(copy.deepcopy(PARAMS)), "attack", attack="ig") == a
    assert a == json.dumps(json.loads(a), sort_keys=True, separators=(",", ":"))
    changed = broken("defenses.noise.std", 0.5)
    assert job_settings(changed, "attack", attack="ig") == a  # the attack does not read it
    assert job_settings(
        changed, "train", dataset="patches", model="resnet18", defense="noise"
    ) != job_settings(PARAMS, "train", dataset="patches", model="resnet18", defense="noise")


def test_cli_reports_a_misspelled_key_and_exits_2(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(broken("defenses.noise.std", rename="stdd")))
    proc = subprocess.run(
        [sys.executable, "-m", "gradinv.cli", "validate", "--params", str(bad)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "defenses.noise.stdd: unknown key; did you mean 'std'" in proc.stderr


def test_a_variant_inherits_its_base_and_overrides_only_its_own_keys():
    cfg = validate(copy.deepcopy(PARAMS))
    base, variant = cfg["defenses"]["censor"], cfg["defenses"]["censor_whole"]
    assert "from" not in variant
    assert variant["scope"] == "whole-model" and variant["label"] == "Censor (whole model)"
    assert {k: v for k, v in variant.items() if k not in ("scope", "label")} == {
        k: v for k, v in base.items() if k not in ("scope", "label")
    }
    # Changing the base changes the variant's jobs (they carry the full settings).
    changed = broken("defenses.censor.selection_lr", 1e-4)
    cfg2 = validate(changed)
    assert cfg2["defenses"]["censor_whole"]["selection_lr"] == 1e-4
    key = {"dataset": "patches", "model": "cnn3", "defense": "censor_whole"}
    assert job_settings(cfg, "train", **key) != job_settings(cfg2, "train", **key)


def test_convergence_jobs_get_the_studys_partition_and_fl():
    cfg = validate(copy.deepcopy(PARAMS))
    train = json.loads(
        job_settings(
            cfg, "convergence_train", dataset="patches", model="cnn3", defense="none", k="6"
        )
    )
    conv = PARAMS["convergence"]
    assert train["partition"] == conv["partition"]
    assert train["fl"]["clients_per_round"] == 6
    assert train["fl"]["rounds"] == conv["fl"]["rounds"]
    assert train["fl"]["checkpoint_rounds"] == [conv["fl"]["rounds"]]
    assert train["fl"]["lr"] == conv["fl"]["lr"] != PARAMS["fl"]["lr"]
    assert train["fl"]["batch_size"] == PARAMS["fl"]["batch_size"]  # not overridden: from `fl`


def test_utility_jobs_train_with_the_studys_fl_and_keep_the_last_model():
    cfg = validate(copy.deepcopy(PARAMS))
    key = {"dataset": "patches", "model": "cnn3", "defense": "dp_sgd", "seed": "2"}
    job = json.loads(job_settings(cfg, "utility_train", **key))
    assert job["seed"] == 2  # the run's own seed, one of utility.seeds
    study = PARAMS["utility"]["fl"]
    assert job["fl"]["rounds"] == study["rounds"] and job["fl"]["checkpoint_rounds"] == [
        study["rounds"]
    ]
    assert job["fl"]["batch_size"] == PARAMS["fl"]["batch_size"]  # the rest from `fl`
    assert job["partition"] == PARAMS["partition"] and job["defense"] == cfg["defenses"]["dp_sgd"]


def test_a_papers_recipe_trains_its_runs_as_its_code_does():
    """CVB's tables read runs trained as CVB's code trains (FedAvg, Adam, a local epoch), the
    utility study its common FedSGD recipe; each recipe's report lists its own defenses."""
    cfg = validate(copy.deepcopy(PARAMS))
    key = {"dataset": "patches", "model": "vit", "defense": "cvb", "seed": "0"}
    cvb = json.loads(job_settings(cfg, "utility_train", **key, recipe="cvb"))
    own = PARAMS["recipes"]["cvb"]["fl"]
    assert cvb["fl"]["protocol"] == "fedavg" and cvb["fl"]["client_optimizer"] == "adam"
    assert cvb["fl"]["local_epochs"] == own["local_epochs"] == 1
    assert cvb["fl"]["checkpoint_rounds"] == [own["rounds"]]
    common = json.loads(job_settings(cfg, "utility_train", **key, recipe="common"))
    assert common["fl"]["protocol"] == "fedsgd" and common["fl"] != cvb["fl"]
    runs = table_utility_runs(cfg, "cvb_table5")
    assert runs and all(r.startswith("results/utility/cvb/") for r in runs)
    assert all(
        r.startswith("results/utility/common/") for r in table_utility_runs(cfg, "refiner_fig6")
    )
    report = json.loads(job_settings(cfg, "utility_report", recipe="censor"))
    assert report["utility"]["defenses"] == PARAMS["recipes"]["censor"]["defenses"]
    assert "CENSOR's recipe" in report["utility"]["title"]
    # the paper's lr 0.1 in the paper overlay; the default scale's CNN trains at 0.05 (at 0.1 it
    # diverged without a defense: docs/censor.md, "CENSOR's recipe")
    paper = validate(load(ROOT / "params.yaml", (ROOT / "workflow/configs/paper.yaml",)))
    at_scale = {
        "default": report["fl"]["lr"],
        "paper": json.loads(job_settings(paper, "utility_report", recipe="censor"))["fl"]["lr"],
    }
    assert at_scale == {"default": 0.05, "paper": 0.1}
    # the convergence study (Figs. 7-8, Table VI) likewise: at 0.1 its undefended run diverged
    study = {}
    for name, c in (("default", cfg), ("paper", paper)):
        run = dict(dataset=c["convergence"]["dataset"], model=c["convergence"]["model"])
        settings = job_settings(c, "convergence_train", **run, defense="none", k="10")
        study[name] = json.loads(settings)["fl"]["lr"]
    assert study == {"default": 0.05, "paper": 0.1}
    with pytest.raises(ConfigError, match=r"tables.cvb_table5.recipe: 'cbv' is not defined"):
        validate(broken("tables.cvb_table5.recipe", "cbv"))
    with pytest.raises(ConfigError, match=r"recipes.cvb.fl.momentum: a FedAvg client's setting"):
        validate(
            broken(
                "recipes.cvb.fl",
                {
                    **own,
                    "protocol": "fedsgd",
                    "client_optimizer": "sgd",
                    "local_epochs": 0,
                    "momentum": 0.9,
                },
            )
        )


def test_dcs2s_recipe_defends_one_client_of_ten_as_its_code_does():
    """DCS²'s code applies the defense on one client only (fl/main.py: DevNum == Pro_dev, 5 of
    1-10); its recipes, IID and the paper overlay's non-IID, train so; every other run defends
    every client. A client outside the recipe's partition is refused by name."""
    default = validate(copy.deepcopy(PARAMS))
    paper = validate(load(ROOT / "params.yaml", (ROOT / "workflow/configs/paper.yaml",)))
    key = {"dataset": "patches", "model": "lenet", "defense": "soteria", "seed": "0"}
    defended = {
        recipe: json.loads(job_settings(cfg, "utility_train", **key, recipe=recipe))["fl"][
            "defended_clients"
        ]
        for cfg, recipe in (
            (default, "dcs2"),
            (paper, "dcs2_noniid"),
            (default, "common"),
            (default, "cvb"),
        )
    }
    assert defended == {"dcs2": [4], "dcs2_noniid": [4], "common": "all", "cvb": "all"}
    fl = {**PARAMS["recipes"]["dcs2"]["fl"], "defended_clients": [4, 10]}
    with pytest.raises(ConfigError, match=r"recipes.dcs2.fl.defended_clients: client 10 is not"):
        validate(broken("recipes.dcs2.fl", fl))
    with pytest.raises(ConfigError, match=r"fl.defended_clients"):
        validate(broken("fl.defended_clients", []))


def test_a_recipe_with_its_own_clients_trains_on_its_own_partition():
    """CENSOR's recipe trains on non-IID clients (its Sec. V-C): its runs read a partition file
    of their own, made from the recipe's partition merged over `partition`; a recipe without
    one (CVB's) trains on the dataset's partition, with the settings of every other run."""
    cfg = validate(copy.deepcopy(PARAMS))
    key = {"dataset": "patches", "model": "cnn3", "defense": "censor", "seed": "0"}
    censor = json.loads(job_settings(cfg, "utility_train", **key, recipe="censor"))
    own = PARAMS["recipes"]["censor"]["partition"]
    assert censor["partition"] == {**PARAMS["partition"], **own}
    assert censor["partition"]["scheme"] == "dirichlet"
    made = json.loads(job_settings(cfg, "recipe_partition", dataset="patches", recipe="censor"))
    assert made["partition"] == censor["partition"]
    assert recipe_partition_file(cfg, "censor", "patches") == "data/partitions/patches.censor.json"
    cvb = json.loads(job_settings(cfg, "utility_train", **key, recipe="cvb"))
    assert cvb["partition"] == PARAMS["partition"]
    assert recipe_partition_file(cfg, "cvb", "patches") == "data/partitions/patches.json"
    assert recipe_partition_file(cfg, "common", "patches") == "data/partitions/patches.json"
    with pytest.raises(ConfigError, match=r"recipes.censor.partition"):
        validate(broken("recipes.censor.partition", {"scheme": "diriclet"}))
    # its clients must fill the recipe's batches (checked on the recipe's split, not the common)
    with pytest.raises(ConfigError, match=r"recipes.censor.partition leaves a client of patches"):
        validate(broken("recipes.censor.partition", {"scheme": "iid", "num_clients": 200}))


def test_a_models_attack_settings_change_its_attacks_not_its_training():
    """LeNet's attacks run longer than the CNN's (params.yaml models.lenet.attack_settings):
    its attack and score jobs carry them, its training jobs do not (no rerun of the models)."""
    cfg = validate(copy.deepcopy(PARAMS))
    run = {"dataset": "patches", "defense": "none", "round": "0", "bs": "1", "victim": "0"}
    lenet = json.loads(job_settings(cfg, "attack", model="lenet", attack="ig", **run))
    cnn = json.loads(job_settings(cfg, "attack", model="cnn3", attack="ig", **run))
    own = PARAMS["models"]["lenet"]["attack_settings"]["inverting_gradients"]["iterations"]
    assert lenet["attack"]["iterations"] == own != cnn["attack"]["iterations"]
    changed = broken("models.lenet.attack_settings", {"inverting_gradients": {"iterations": 7}})
    cfg2 = validate(changed)
    train = {"dataset": "patches", "model": "lenet", "defense": "none"}
    assert job_settings(cfg, "train", **train) == job_settings(cfg2, "train", **train)
    score = {**run, "model": "lenet", "attack": "ig"}
    assert job_settings(cfg, "score", **score) != job_settings(cfg2, "score", **score)
    with pytest.raises(ConfigError, match=r"models.lenet.attack_settings.invert: 'invert' is not"):
        validate(broken("models.lenet.attack_settings", {"invert": {"iterations": 7}}))


def test_the_official_loop_runs_without_partition_or_fl():
    cfg = validate(copy.deepcopy(PARAMS))
    key = {"dataset": "patches", "model": "cnn3", "defense": "censor_code"}
    job = json.loads(job_settings(cfg, "convergence_official", **key))
    loop = {k: v for k, v in PARAMS["convergence"]["official_loop"].items() if k != "defenses"}
    assert job["official_loop"] == {**loop, "eval_samples": PARAMS["fl"]["eval_samples"]}
    assert job["partition"] is None and job["fl"] is None
    assert job["defense"] == cfg["defenses"]["censor_code"]


def test_the_stored_method_schemas_and_facts_match_the_registries():
    """Validation and the job graph read each method's settings schema and facts from
    workflow/schemas/methods.json, without importing the methods (torch); it must say what the
    registries say."""
    from gradinv import methods

    assert methods.stored() == methods.generate(), (
        f"{methods.PATH} is stale: regenerate it with `gradinv schema --write`"
    )


def test_a_checked_configuration_is_not_checked_again_and_a_changed_one_is(tmp_path, monkeypatch):
    """The mark of a configuration that passed (its digest, with gradinv's code and schemas)
    spares the next call the schema and the cross-checks; any other configuration is checked."""
    import jsonschema

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    validate(copy.deepcopy(raw), checked=tmp_path)
    assert len(list(tmp_path.iterdir())) == 1

    def no_schema(*args, **kwargs):
        raise AssertionError("the schema was checked again")

    with monkeypatch.context() as m:
        m.setattr(jsonschema, "Draft202012Validator", no_schema)
        validate(copy.deepcopy(raw), checked=tmp_path)  # the same: the mark answers
    broken = copy.deepcopy(raw)
    broken["defenses"]["noise"]["std"] = -1
    with pytest.raises(ConfigError, match=r"defenses\.noise\.std: -1 is out of range"):
        validate(broken, checked=tmp_path)
    assert len(list(tmp_path.iterdir())) == 1  # a refused one leaves no mark


def test_a_dry_run_imports_no_torch_once_the_configuration_was_checked(tmp_path):
    """Every Snakemake call (-n, --lint, --report) validates the configuration and builds the
    job graph; the second call on an unchanged configuration and code loads no torch."""
    from test_workflow import SNAKEMAKE, quiet_env, workflow_copy

    root = workflow_copy(tmp_path)
    args = [*SNAKEMAKE, "-n", "results/table1.csv", "--configfile", "tests/configs/micro.yaml"]
    first = subprocess.run(args, cwd=root, capture_output=True, text=True, env=quiet_env())
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run(
        args,
        cwd=root,
        capture_output=True,
        text=True,
        env={**quiet_env(), "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert again.returncode == 0, again.stderr[-3000:]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if "|" in line
    }
    assert "gradinv.jobs" in imported  # the profile covers the workflow's own modules
    assert "torch" not in imported and "gradinv.attacks" not in imported
    assert "report" in again.stdout  # and the job graph is all there


def test_prose_lives_in_the_notes_not_in_params_and_fills_every_block():
    """params.yaml holds settings (what `dvc params diff` compares); the prose the results
    print comes from workflow/notes.yaml, filled into each table, study and recipe at
    validation; a block that gives its own (an overlay's table) keeps it."""
    from gradinv.config import NOTE_KEYS, NOTES_PATH

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    blocks = [*raw["tables"].values(), *raw["recipes"].values()]
    blocks += [raw[s] for s in ("convergence", "utility", "client_time")]
    assert not [k for b in blocks for k in NOTE_KEYS if k in b]
    config = load(ROOT / "params.yaml")
    assert all(spec["scaled_down_note"].strip() for spec in config["tables"].values())
    assert config["tables"]["fig9_trials"]["no_reference"].startswith("CENSOR's Fig. 9")
    assert config["recipes"]["cvb"]["source"].startswith("the CVB code's")
    assert config["convergence"]["scaled_down_note"].strip()
    notes = yaml.safe_load(NOTES_PATH.read_text())
    assert set(notes["tables"]) == set(config["tables"])  # a note for every shipped table
    own = load(ROOT / "params.yaml", (ROOT / "workflow/configs/data_centric.yaml",))
    assert own["tables"]["data_centric"]["scaled_down_note"].startswith("Refiner's paper")


@pytest.mark.parametrize("overlays", [(), (ROOT / "workflow/configs/paper.yaml",)])
def test_accuracy_comes_from_at_least_three_paired_seeds(overlays):
    """Every utility run behind a claim or a PMM column runs at each of at least 3 seeds, the
    same for every defense and recipe (issue 30); the test overlays may use fewer, for speed."""
    config = validate(load(ROOT / "params.yaml", overlays))
    seeds = config["utility"]["seeds"]
    assert len(set(seeds)) == len(seeds) >= 3


def test_every_table_is_filed_under_its_paper_in_the_report_and_a_new_one_across_papers():
    config = load(ROOT / "params.yaml", (ROOT / "workflow/configs/paper.yaml",))
    papers = {name: report_category(name) for name in config["tables"]}
    assert papers["table1"] == papers["fig9_trials"] == papers["censor_variants"] == CENSOR
    assert papers["refiner_fig6"] == PAPERS["refiner_"] and papers["dcs2_table1"] == PAPERS["dcs2_"]
    assert papers["frontier_runs"] == ACROSS
    # A researcher's own table is no paper's: it must not land among CENSOR's.
    assert report_category("my_defense_vs_ig") == ACROSS
