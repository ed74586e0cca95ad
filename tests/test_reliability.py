"""Reliability: every configuration that cannot run to the end is refused before the first job,
by `snakemake` and by `gradinv validate` alike, and concurrent runs keep their locks.

The classes (issue 31): configuration files that would run code or hide a value (YTE, Python
tags, repeated keys, NaN, empty or list files, broken YAML); names that would leave results/ or
reach a command line; values the schema's bounds let through (NaN, infinities, integers beyond
64 bits, repeated list entries); combinations a job would refuse hours later (no channels, patches
larger than the photos, a missing reference file, clients with fewer images than a batch); a
required setting that nothing read; a workflow lock that a second run deleted.
"""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gradinv import config_guard, pipeline
from gradinv.cli import main as cli_main
from gradinv.config import NAME, NAMED_SECTIONS, load, validate
from gradinv.config_files import ConfigFileError, read_config_file
from gradinv.settings import ConfigError
from test_workflow import SNAKEMAKE, quiet_env, workflow_copy

ROOT = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
MARKER = "PWNED"  # a file that a payload would create in the overlay's folder

# name -> (file name, text, what the refusal says). {marker} is the payload's target.
BAD_FILES: dict[str, tuple[str, str, str]] = {
    "yte": (
        "o.yaml",
        "__use_yte__: true\nseed: ?open('{marker}', 'w').write('x') and 0\n",
        r"__use_yte__ asks Snakemake to render the file with YTE",
    ),
    "python-tag": (
        "o.yaml",
        "seed: !!python/object/apply:os.system ['touch {marker}']\n",
        r"line 1, column 7: the tag !!python/object/apply:os.system asks for a Python object",
    ),
    "repeated-key": (
        "o.yaml",
        "fl:\n  lr: 0.1\n  lr: 0.2\n",
        r"line 3, column 3: the key 'lr' appears twice in one mapping \(first on line 2\)",
    ),
    "repeated-key-json": (
        "o.json",
        '{"fl": {"lr": 0.1, "lr": 0.2}}',
        r"the key 'lr' appears twice in one object",
    ),
    "nan-json": ("o.json", '{"fl": {"lr": NaN}}', r"NaN is not a number a setting can take"),
    "empty": ("o.yaml", "", r"is empty: a configuration file is a mapping"),
    "comments-only": ("o.yaml", "# nothing\n", r"is empty: a configuration file is a mapping"),
    "list": ("o.yaml", "- fl\n- seed\n", r"holds a list, not a mapping"),
    "scalar": ("o.yaml", "3\n", r"holds a int, not a mapping"),
    "broken-yaml": ("o.yaml", "fl: {lr: [0.1\n", r"line \d+, column \d+: not valid YAML"),
    "tab-indent": ("o.yaml", "fl:\n\tlr: 0.1\n", r"line 2, column 1: not valid YAML"),
}

# name -> (overlay text, the key the refusal names and why)
BAD_VALUES: dict[str, tuple[str, str]] = {
    "nan": ("fl: {lr: .nan}\n", r"fl\.lr: nan is not a number a setting can take"),
    "inf": ("fl: {lr: .inf}\n", r"fl\.lr: inf is not a number a setting can take"),
    "minus-inf": ("defenses: {noise: {std: -.inf}}\n", r"defenses\.noise\.std: -inf is not a"),
    "seed-beyond-64-bits": ("seed: 1180591620717411303424\n", r"seed: 1180591620717411303424 does"),
    "table-name-escapes": (
        "tables: {'../../x': {}}\n",
        r"tables\.\.\./\.\./x: '\.\./\.\./x' is not a valid name",
    ),
    "defense-name-space": (
        "defenses: {'a b': {kind: noise, label: x}}\n",
        r"'a b' is not a valid name",
    ),
    "attack-name-shell": (
        "attacks: {'$(touch {marker})': {kind: ig, label: x}}\n",
        r"is not a valid name",
    ),
    "sweep-point-name": (
        "sweeps: {s: {defense: noise, setting: std, values: ['a/b']}}\n",
        r"'noise-stda/b' is not a valid name",
    ),
    "repeated-defense": (
        "tables: {table1: {defenses: [none, none]}}\n",
        r'tables\.table1\.defenses: "none" appears more than once',
    ),
    "repeated-metric": (
        "metrics: {names: [psnr, psnr]}\n",
        r'metrics\.names: "psnr" appears more than once',
    ),
    "no-channels": (
        "models: {cnn3: {channels: []}}\n",
        r"models\.cnn3\.channels: \[\] should be non-empty",
    ),
    "zero-channels": (
        "models: {cnn3: {channels: [0, 32]}}\n",
        r"models\.cnn3\.channels\.0: 0 is out of range",
    ),
    "patches-larger-than-photos": (
        "data: {sources: {patches: {image_size: 200}}}\n",
        r"too small for 200-px patches; raise source_side",
    ),
    "missing-reference": (
        "tables: {table1: {reference: workflow/reference/nope.csv}}\n",
        r"tables\.table1\.reference: workflow/reference/nope\.csv does not exist",
    ),
    "clients-smaller-than-a-batch": (
        "partition: {num_clients: 1000, scheme: iid}\n",
        r"partition leaves a client of patches with \d training images, fewer than fl\.batch_size",
    ),
    # the utility study on digits (its labels known only once prepared), while the tables that
    # show accuracy or PMM train on patches: each recipe checked on the datasets it trains
    "common-recipe-clients-smaller-than-a-batch-on-a-table-dataset": (
        "utility: {dataset: digits, fl: {batch_size: 1000}}\n",
        r"partition leaves a client of patches with \d+ training images, fewer than "
        r"utility\.fl\.batch_size 1000",
    ),
    "recipe-clients-smaller-than-a-batch-on-a-table-dataset": (
        "utility: {dataset: digits}\nrecipes: {dcs2: {fl: {batch_size: 1000}}}\n",
        r"partition leaves a client of patches with \d+ training images, fewer than "
        r"recipes\.dcs2\.fl\.batch_size 1000",
    ),
    "removed-setting": (
        "data: {prepared_dir: elsewhere}\n",
        r"data\.prepared_dir: this setting was removed",
    ),
}


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text.replace("{marker}", str(folder / MARKER)))
    return path


# ---------------------------------------------------------------- one reader, one validation


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_configuration_file_is_refused_with_its_place(tmp_path, case):
    name, text, message = BAD_FILES[case]
    path = _write(tmp_path, name, text)
    with pytest.raises(ConfigFileError, match=message):
        read_config_file(path)
    with pytest.raises(ConfigError, match=re.escape(str(path)) + ".*" + message):
        load(ROOT / "params.yaml", (path,))
    assert not (tmp_path / MARKER).exists()


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_a_bad_value_is_refused_before_any_job(tmp_path, case):
    text, message = BAD_VALUES[case]
    overlay = _write(tmp_path, "o.yaml", text)
    with pytest.raises(ConfigError, match=message):
        load(ROOT / "params.yaml", (overlay,))
    assert not (tmp_path / MARKER).exists()


def _normalized(text: str, overlay: Path) -> str:
    """A refusal without the words that name its source (the two tools name it differently)."""
    for source in (
        f"params.yaml + {overlay}",
        "params.yaml (with any --configfile overlays)",
    ):
        text = text.replace(source, "SOURCE")
    return " ".join(text.split())


def _gradinv_says(overlay: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gradinv.cli", "validate", "--configfile", str(overlay)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=quiet_env(),
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    prefix = "gradinv validate: configuration error: "
    assert proc.stderr.startswith(prefix), proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr[len(prefix) :].strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return workflow_copy(tmp_path_factory.mktemp("project"))


ALL_BAD = {
    **{f"file-{k}": (name, text) for k, (name, text, _) in BAD_FILES.items()},
    **{f"value-{k}": ("o.yaml", text) for k, (text, _) in BAD_VALUES.items()},
}


@pytest.mark.parametrize("case", list(ALL_BAD))
def test_snakemake_and_gradinv_validate_refuse_an_overlay_in_the_same_words(
    tmp_path, project, case
):
    """`snakemake -n` reads the overlay with gradinv's reader (the guard) and validates the
    merged config with gradinv's validation: the same refusal as `gradinv validate`, before any
    job, and a payload never runs."""
    name, text = ALL_BAD[case]
    overlay = _write(tmp_path, name, text)
    said = _gradinv_says(overlay)
    proc = subprocess.run(
        [*SNAKEMAKE, "-n", "--cores", "1", "results/table1.csv", "--configfile", str(overlay)],
        cwd=project,
        capture_output=True,
        text=True,
        env=quiet_env(),
        timeout=300,
    )
    told = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert _normalized(said, overlay) in _normalized(told, overlay), told[-3000:]
    assert not (tmp_path / MARKER).exists()
    assert not list((project / "results").glob("**/*.json"))  # no job ran


def test_the_guard_is_installed_and_active_in_this_environment():
    """`make env` installs the guard; Snakemake's loader is gradinv's in every process."""
    assert config_guard.pth_path().read_text() == config_guard.PTH_LINE
    import snakemake.common.configfile as loader  # noqa: F401 (the import patches it)

    assert config_guard.active()
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import snakemake.settings.types as t, gradinv.config_guard as g;"
            "print(g.active(), t.load_configfile.__module__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == ["True", "gradinv.config_guard"]


def test_without_the_guard_the_snakefile_still_refuses_the_file_and_warns(tmp_path, capsys):
    """A Snakefile run in an environment without the guard reads every configuration file again
    with gradinv's reader: the file is refused all the same, and a warning names the fix."""
    import snakemake.common.configfile  # noqa: F401 (the module the guard patches)
    from snakemake.exceptions import WorkflowError

    overlay = _write(tmp_path, "o.yaml", "__use_yte__: true\nseed: 0\n")
    module = sys.modules[config_guard.TARGET]
    flag = config_guard._PATCHED
    saved = getattr(module, flag, False)
    setattr(module, flag, False)
    try:
        with pytest.raises(WorkflowError, match="__use_yte__ asks Snakemake"):
            pipeline.validated(copy.deepcopy(PARAMS), [ROOT / "params.yaml", overlay])
    finally:
        setattr(module, flag, saved)
    assert "gradinv guard install" in capsys.readouterr().err


# ---------------------------------------------------------------- every name, every number


BAD_NAMES = ["../../x", "a b", "$(touch x)", "x/y", "..", "-x", "a;b", "é", "x" * 129]


@pytest.mark.parametrize("section", NAMED_SECTIONS)
@pytest.mark.parametrize("bad", BAD_NAMES)
def test_every_named_section_refuses_a_name_outside_the_pattern(section, bad):
    cfg = copy.deepcopy(PARAMS)
    cfg.setdefault(section, {})[bad] = {}
    with pytest.raises(ConfigError, match=rf"{section}\..*is not a valid name"):
        validate(cfg)
    assert not re.fullmatch(NAME, bad)


def test_the_snakefile_constrains_its_wildcards_to_the_same_patterns():
    common = (ROOT / "workflow/rules/common.smk").read_text()
    assert "from gradinv.config import NAME, RUN_NAME" in common
    for wildcard in ("dataset", "model", "attack", "table", "recipe", "generator"):
        assert f"    {wildcard}=NAME," in common
    assert "    defense=RUN_NAME," in common


def _numbers(node: Any, path: tuple = ()) -> list[tuple]:
    """The path of every number in params.yaml (bools are not numbers)."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _numbers(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _numbers(v, (*path, i))]
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return [path]
    return []


NUMBERS = _numbers(PARAMS)


def _with(path: tuple, value: Any) -> dict:
    cfg = copy.deepcopy(PARAMS)
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return cfg


def _dotted(path: tuple) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 2**64])
def test_every_number_of_params_yaml_refuses_non_finite_and_oversized_values(value):
    assert len(NUMBERS) > 100  # the walk found params.yaml's numbers
    for path in NUMBERS:
        with pytest.raises(ConfigError, match=re.escape(f": {_dotted(path)}: ")):
            validate(_with(path, value))


# ---------------------------------------------------------------- the lock of a workflow


LOCK_SNAKEFILE = """
from gradinv import pipeline

if workflow.is_main_process:
    pipeline.clear_stale_lock()

onstart:
    pipeline.claim_lock(workflow.persistence)

onsuccess:
    pipeline.release_lock(workflow.persistence)

onerror:
    pipeline.release_lock(workflow.persistence)

rule slow:
    output: "slow.txt"
    # runs until the test lets it end (at most 5 minutes)
    shell: "date +%s%N >> runs.txt; for i in $(seq 3000); do [ -e release ] && break; sleep 0.1; done; echo done > {output}"

rule quick:
    output: "quick.txt"
    shell: "echo done > {output}"
"""


def test_the_snakefile_uses_the_lock_hooks_this_test_runs():
    snakefile = (ROOT / "Snakefile").read_text()
    for call in (
        "pipeline.clear_stale_lock()",
        "pipeline.claim_lock(workflow.persistence)",
        "pipeline.release_lock(workflow.persistence)",
    ):
        assert call in snakefile


def test_concurrent_runs_in_one_folder_keep_each_others_locks(tmp_path):
    """Run 1 builds a slow target; run 2 builds another one in the same folder and ends first;
    run 3 asks for run 1's target again. Snakemake 9 removes the whole locks folder when a run
    ends, so run 3 used to start run 1's job a second time; now it is refused, and run 1 ends
    well with its job run once."""
    (tmp_path / "Snakefile").write_text(LOCK_SNAKEFILE)

    def start(target: str) -> subprocess.Popen:
        return subprocess.Popen(
            [*SNAKEMAKE, target, "--cores", "1"],
            cwd=tmp_path,
            env=quiet_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    first = start("slow.txt")
    deadline = time.monotonic() + 60
    while not list((tmp_path / ".snakemake" / "gradinv-lock-owners").glob("*.json")):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    second = start("quick.txt")
    assert second.wait(timeout=120) == 0, second.stdout.read()
    assert first.poll() is None  # still building: its job waits for the test's release file
    third = start("slow.txt")
    third_out, _ = third.communicate(timeout=120)
    assert third.returncode != 0 and "cannot be locked" in third_out, third_out
    (tmp_path / "release").touch()  # run 1's job may end now
    first_out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, first_out
    assert len((tmp_path / "runs.txt").read_text().split()) == 1  # run 1's job ran once
    assert not list((tmp_path / ".snakemake" / "locks").glob("*.lock"))
    assert not list((tmp_path / ".snakemake" / "gradinv-lock-owners").glob("*.json"))


def test_a_killed_runs_lock_is_cleared_and_a_live_ones_kept(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    owners = tmp_path / pipeline.OWNERS
    locks.mkdir(parents=True)
    owners.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for i, pid in ((0, dead.pid), (1, __import__("os").getpid())):
        (locks / f"{i}.output.lock").write_text("x\n")
        (owners / f"{i}.output.lock.json").write_text(
            f'{{"pid": {pid}, "host": "{__import__("socket").gethostname()}", "started": null}}'
        )
    (locks / "2.input.lock").write_text("y\n")  # no record: a run before its onstart
    assert pipeline.clear_stale_lock(tmp_path)
    assert sorted(p.name for p in locks.iterdir()) == ["1.output.lock", "2.input.lock"]
    assert [p.name for p in owners.iterdir()] == ["1.output.lock.json"]


# ---------------------------------------------------------------- recovery hints


def test_the_jobs_recovery_hints_get_the_runs_overlays_and_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workflow/configs").mkdir(parents=True)
    inside = tmp_path / "workflow/configs/paper.yaml"
    options = pipeline.rerun_options(
        [inside, Path("/elsewhere/my overlay.yaml")],
        ["snakemake", "results/table1.csv", "--profile", "profiles/slurm", "--cores", "8"],
    )
    assert options == (
        "--configfile workflow/configs/paper.yaml '/elsewhere/my overlay.yaml' "
        "--profile profiles/slurm"
    )
    assert pipeline.rerun_options([], ["snakemake", "--cores", "2"]) == ""


def test_gradinv_validate_names_the_files_it_validated(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli_main(["validate", "--configfile", "tests/configs/tiny.yaml"]) == 0
    assert capsys.readouterr().out.strip() == "params.yaml + tests/configs/tiny.yaml: valid"


def test_training_refuses_a_client_with_fewer_images_than_a_batch():
    """Where the configuration check cannot know the clients (a downloaded dataset), training
    refuses them before its first round instead of taking smaller batches."""
    import torch

    from gradinv.defenses import build_defense
    from gradinv.fl.server import FLSettings, train
    from gradinv.models import ModelSpec, build_model

    spec = ModelSpec("cnn3", num_classes=4, in_channels=3, image_size=16, settings={})
    x, y = torch.randn(40, 3, 16, 16), torch.randint(0, 4, (40,))
    fl = FLSettings(
        protocol="fedsgd",
        rounds=1,
        clients_per_round=2,
        batch_size=8,
        lr=0.1,
        local_steps=1,
        local_lr=0.0,
        eval_every=1,
        checkpoint_rounds=(0,),
        eval_samples=0,
    )
    defense = build_defense("none", {}, where="test")
    with pytest.raises(ConfigError, match=r"client 1 holds 3 training images \(1 of 2 clients"):
        train(
            build_model(spec, seed=0),
            x,
            y,
            [list(range(37)), [37, 38, 39]],
            x,
            y,
            defense,
            fl,
            0,
            lambda r, m: None,
        )


def test_tracking_uri_reaches_every_job_only_when_set(monkeypatch):
    """tracking.uri (a tracking server on a cluster) is exported to the jobs; empty, the jobs
    keep their default store (and a test's GRADINV_TRACKING_URI stays as it was)."""
    cfg = copy.deepcopy(PARAMS)
    for name in (  # export_runtime sets os.environ: these are restored after the test
        "GRADINV_SNAKEMAKE_OPTIONS",
        "GRADINV_TRACKING_EXPERIMENT",
        "GRADINV_TRACKING_ENABLED",
        "GRADINV_TRACKING_DEFER",
        "GRADINV_PROGRESS_EVERY",
    ):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("GRADINV_TRACKING_URI", "sqlite:////tmp/test-store.db")
    assert "GRADINV_TRACKING_URI" not in pipeline.export_runtime(cfg)
    assert __import__("os").environ["GRADINV_TRACKING_URI"] == "sqlite:////tmp/test-store.db"
    cfg["tracking"]["uri"] = "http://submit-host:5000"
    assert "GRADINV_TRACKING_URI" in pipeline.export_runtime(cfg)
    assert __import__("os").environ["GRADINV_TRACKING_URI"] == "http://submit-host:5000"
    cfg["tracking"]["uri"] = "submit-host:5000"
    with pytest.raises(ConfigError, match=r"tracking\.uri"):
        validate(cfg)


# ---------------------------------------------------------------- where each rule runs


def test_every_rule_runs_either_on_the_submit_host_or_through_the_scheduler():
    """gradinv.cluster places every rule of the Snakefile (the paper overlay's too), with a
    reason for each local one; a scheduler gets only the rules that take a device."""
    from gradinv import cluster

    for overlay in ([], ["--configfile", "workflow/configs/paper.yaml"]):
        proc = subprocess.run(
            [*SNAKEMAKE, "--list-rules", *overlay],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=quiet_env(),
            check=True,
        )
        rules = set(proc.stdout.split())
        placed = {*cluster.LOCAL_RULES, *cluster.REMOTE_RULES, *cluster.VARIANTS}
        assert rules == rules & placed, rules - placed
        assert not set(cluster.LOCAL_RULES) & set(cluster.REMOTE_RULES)
    assert all(cluster.LOCAL_RULES.values())


def test_resources_and_groups_come_from_the_config():
    from gradinv import cluster

    cfg = copy.deepcopy(PARAMS)
    assert cluster.resources(cfg, "attack") == {
        "cpus_per_task": 1,
        "mem_mb": 2000,
        "runtime": 60,
        "gpu": 0,
    }
    assert cluster.resources(cfg, "train_utility")["runtime"] == 240
    assert "gpu" not in cluster.resources(cfg, "score")
    cfg["cluster"]["gpus"] = True  # a CPU setting that still asks for the GPU partition
    assert cluster.resources(cfg, "attack")["gpu"] == 1
    cfg["device"], cfg["cluster"]["gpus"] = "auto", "auto"
    assert cluster.resources(cfg, "capture")["gpu"] == 1
    assert cluster.group(cfg, "attack") == "cell" and cluster.group(cfg, "train") is None
    cfg["cluster"]["group_cells"] = False
    assert cluster.group(cfg, "attack") is None
    cfg["cluster"]["resources"]["scor"] = {"runtime": 5}
    with pytest.raises(ConfigError, match=r"cluster\.resources\.scor: no rule 'scor'"):
        validate(cfg)


# Lines as snakemake-executor-plugin-slurm 2.8 logs its submissions (tests/test_slurm.py's runs).
SUBMISSIONS = """\
Job 3 has been submitted with SLURM jobid 41 (log: /p/.snakemake/slurm_logs/rule_train/patches_cnn3_none/41.log).
Job 5 has been submitted with SLURM jobid 42 (log: /p/.snakemake/slurm_logs/group_cell/g/42.log).
Job 6 has been submitted with SLURM jobid 43 (log: /p/.snakemake/slurm_logs/rule_attack/a/43.log).
Job 7 has been submitted with SLURM jobid 44 (log: /p/.snakemake/slurm_logs/rule_train_utility/u/44.log).
Job 8 has been submitted with SLURM jobid 45 (log: /p/.snakemake/slurm_logs/rule_capture/c/45.log).
"""


def test_a_job_slurm_stopped_is_explained_with_the_limit_to_raise():
    from gradinv import cluster

    cfg = copy.deepcopy(PARAMS)
    states = {"41": "TIMEOUT", "42": "OUT_OF_MEMORY", "43": "NODE_FAIL", "44": "COMPLETED"}
    states["45"] = "FAILED"  # the job's own error: its log says why, not the scheduler
    said = cluster.explain_slurm_failures(SUBMISSIONS, cfg, lambda ids: states)
    assert len(said) == 3
    timeout, memory, node = said
    assert "train (SLURM job 41, state TIMEOUT) at its time limit" in timeout
    assert "runtime was 60 minutes (cluster.resources.default)" in timeout
    assert "Raise cluster.resources.train.runtime" in timeout and "Rerun the same" in timeout
    assert "cluster.resources.capture.mem_mb and cluster.resources.attack.mem_mb" in memory
    assert "NODE_FAIL" in node and "--slurm-requeue" in node
    cfg["cluster"]["resources"]["train"] = {"runtime": 30}
    again = cluster.explain_slurm_failures(SUBMISSIONS, cfg, lambda ids: {"41": "TIMEOUT"})
    assert again and "runtime was 30 minutes (cluster.resources.train)" in again[0]
    assert cluster.explain_slurm_failures("no submissions", cfg, lambda ids: states) == []


def test_onerror_reads_every_log_file_snakemake_passes(tmp_path, capsys):
    """Snakemake 9 gives ``onerror`` the list of its log files, not one path: a failed run's
    handler read it as a path and ended the run with a TypeError from the Snakefile."""
    from gradinv import cluster

    log = tmp_path / "run.snakemake.log"
    log.write_text(SUBMISSIONS)
    states = {"41": "TIMEOUT"}
    cluster.report_slurm_failures(
        [str(log), str(tmp_path / "gone.log")], PARAMS, lambda ids: states
    )
    assert "train (SLURM job 41, state TIMEOUT)" in capsys.readouterr().err
    cluster.report_slurm_failures([], PARAMS, lambda ids: states)  # a run without a log file
    assert capsys.readouterr().err == ""


def test_a_killed_runs_slurm_configuration_is_removed_before_the_next(tmp_path, monkeypatch):
    """start-slurm.sh's configuration with no controller (a test run killed mid-way) would make
    every Snakemake start wait ~9 s on `scontrol`; conftest removes it before any test. Another
    configuration stays, and so does start-slurm.sh's while a controller runs."""
    import shutil

    import services

    ours = tmp_path / "slurm.conf"
    ours.write_text(f"{services.SLURM_MARKER}: single-node cluster\nClusterName=ci\n")
    gres = tmp_path / "gres.conf"
    gres.write_text(f"{services.SLURM_MARKER}: fake GPUs\nAutoDetect=off\n")
    theirs = tmp_path / "slurmdbd.conf"
    theirs.write_text("# the site's own\nDbdHost=db\n")
    configs = (ours, gres, theirs, tmp_path / "absent.conf")

    # a controller runs (a process of that name): nothing is touched
    controller = tmp_path / "slurmctld"
    shutil.copy(shutil.which("sleep"), controller)
    proc = subprocess.Popen([str(controller), "30"])
    try:
        deadline = time.monotonic() + 10
        while not services.running("slurmctld") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert services.remove_stale_slurm_configs(configs) == []
    finally:
        proc.kill()
        proc.wait()
    assert ours.exists() and gres.exists()

    monkeypatch.setattr(services, "running", lambda name: False)  # whatever else runs here
    assert services.remove_stale_slurm_configs(configs) == [ours, gres]
    assert not ours.exists() and not gres.exists() and theirs.exists()
