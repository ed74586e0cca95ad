"""DVC on a cluster: what one machine built is pushed once to a remote and pulled by a fresh clone.

docs/cluster.md ("Running on a cluster") keeps the prepared datasets, their partitions, the generators
and the checkpoints in a DVC remote (a shared folder here; SSH or S3 where users have one). This
test builds the `data` and `generators` stages in a git repository of the project (`dvc repro`,
the DCGAN cut to 20 steps), pushes them to a local-folder remote, clones the repository, pulls,
and checks that the clone has the same files and that Snakemake builds none of them again.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_workflow import ROOT, quiet_env, workflow_copy

pytestmark = pytest.mark.slow

DVC = [sys.executable, "-m", "dvc"]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PULLED = ("data/prepared", "data/partitions", "data/generators")


def _run(cwd: Path, *args, timeout: int = 900) -> str:
    env = {**quiet_env(), "GRADINV_TRACKING": "off"}
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout
    )
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _digests(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for folder in PULLED
        for f in sorted((root / folder).rglob("*"))
        if f.is_file() and f.name != ".gitignore"
    }


def _planned(plan: str) -> dict[str, int]:
    """Rule -> jobs, from the "Job stats" table of Snakemake's dry run."""
    table = plan.split("Job stats:", 1)[1].split("total", 1)[0]
    rows = (line.split() for line in table.splitlines())
    return {r[0]: int(r[1]) for r in rows if len(r) == 2 and r[1].isdigit()}


def test_a_fresh_clone_pulls_what_was_pushed_and_rebuilds_nothing(tmp_path):
    origin, remote, clone = tmp_path / "origin", tmp_path / "remote", tmp_path / "clone"
    workflow_copy(origin)
    for name in ("dvc.yaml", ".gitignore"):
        shutil.copy(ROOT / name, origin / name)
    shutil.copytree(ROOT / "src", origin / "src", ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((origin / "params.yaml").read_text())
    params["generators"]["dcgan"]["steps"] = 20  # a generator in seconds: the files are the point
    (origin / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = functools.partial(_run, origin, "git", "-c", "user.name=t", "-c", "user.email=t@t")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "project")
    _run(origin, *DVC, "init", "-q")
    _run(origin, *DVC, "remote", "add", "-d", "shared", remote)  # docs/cluster.md: a shared folder
    _run(origin, *DVC, "repro", "data", "generators")
    git("add", "-A")
    git("commit", "-qm", "dvc.lock")
    assert "pushed" in _run(origin, *DVC, "push", "data", "generators")
    built = _digests(origin)
    assert any(k.startswith("data/partitions/") for k in built)
    assert any(k.startswith("data/generators/") for k in built)

    _run(tmp_path, "git", "clone", "-q", origin, clone)  # another machine: no data, no cache
    assert not (clone / "data").exists()
    _run(clone, *DVC, "pull", "data", "generators")
    assert _digests(clone) == built
    # docs/cluster.md's next command: the pulled files' times in the order Snakemake expects.
    _run(clone, *SNAKEMAKE, "--touch", "prepared_data", "generators", "--cores", "1")
    plan = _run(clone, *SNAKEMAKE, "-n", "results/table1.csv", "--cores", "1", "--quiet", "rules")
    jobs = _planned(plan)
    assert not {"prepare_data", "partition_data", "train_generator"} & set(jobs), plan
    assert jobs.get("train", 0) > 0  # what was not pulled is still to be built
    assert "Data and pipelines are up to date" in _run(clone, *DVC, "status", "data", "generators")
