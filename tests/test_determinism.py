"""Determinism: the same params.yaml and seed give a byte-identical table on CPU when rerun from
scratch, and every run records its seed."""

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gradinv.tables.files import read_records
from test_workflow import run_folder, run_target, workflow_copy


def job_starts(log: Path) -> list[str]:
    """The rules of the jobs a Snakemake log started, in the order it started them."""
    return re.findall(r"^(?:local)?rule (\w+):$", log.read_text(), flags=re.MULTILINE)


@pytest.mark.slow
def test_a_rerun_from_scratch_gives_a_byte_identical_table(tmp_path):
    """The rerun runs on one core, its jobs one at a time in another order than the first run's
    two at a time: the order decides nothing. On one core the order is the scheduler's own, and a
    victim's chain runs depth first (common.smk's PRIORITY): the first cell is scored before the
    second is captured (without the priorities, both captures run before either score)."""
    micro = "tests/configs/micro.yaml"
    projects = workflow_copy(tmp_path / "a"), workflow_copy(tmp_path / "b")
    for root, cores in zip(projects, ("2", "1"), strict=True):
        run_target(root, "--cores", cores, "--configfile", micro)
    first, second = (run_folder(root, micro) for root in projects)
    (log,) = (projects[1] / ".snakemake/log").glob("*.snakemake.log")
    order = job_starts(log)
    captures = [i for i, rule in enumerate(order) if rule == "capture"]
    assert len(captures) == 2 and order.count("score") == 2, order
    assert order.index("score") < captures[-1], order
    for name in ("table1.csv", "table1.md", "table1_vs_paper.csv"):
        assert (first / "results" / name).read_bytes() == (second / "results" / name).read_bytes()
    cells = sorted((first / "results/metrics").rglob("*.json"))
    assert len(cells) == 2  # 2 defenses, each a cell of 2 victims
    pairs = [
        (a, b)
        for path in cells
        for a, b in zip(
            read_records(path), read_records(second / path.relative_to(first)), strict=True
        )
    ]
    assert len(pairs) == 4
    for a, b in pairs:
        path = a["reconstruction"]
        for timing in (
            "attack_seconds",
            "attack_iterations_per_second",
            "client_seconds",
        ):  # what may vary
            a.pop(timing), b.pop(timing)
        assert a == b, path
        assert a["seed"] == 0
    with sqlite3.connect(projects[0] / "mlflow.db") as db:
        seeds = db.execute(
            "select t.value from runs r join tags t on r.run_uuid = t.run_uuid "
            "where t.key = 'gradinv.seed' and r.lifecycle_stage = 'active'"
        ).fetchall()
    assert len(seeds) == 6 and {s for (s,) in seeds} == {"0"}


def test_a_job_asks_for_deterministic_kernels_without_loading_the_compiler():
    """Every stage calls setup(); torch.use_deterministic_algorithms would import torch._inductor
    (3 s per job on CPU), which no stage uses."""
    code = (
        "import sys, torch; from gradinv.stages.common import setup; setup({}); "
        "print(torch.are_deterministic_algorithms_enabled(), "
        "torch.is_deterministic_algorithms_warn_only_enabled(), 'torch._inductor' in sys.modules, "
        "torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # float32 on a GPU, not TF32 (PyTorch's default for cuDNN's convolutions is TF32)
    assert out.stdout.split() == ["True", "True", "False", "False", "False"]
