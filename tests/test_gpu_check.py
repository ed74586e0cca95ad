"""``make gpu-check`` (benchmarks/gpu_check.py): refused cleanly without a GPU; its helpers.

The check itself needs a GPU and runs only where one is lent (its figures: docs/runs/); here, the
refusal, the project copy its table runs in, and the readers of what the jobs left behind.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from gradinv.config import load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import the modules beside them by name
gpu_check = importlib.import_module("gpu_check")


def test_without_a_gpu_it_refuses_before_running_anything(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/gpu_check.py"),
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert r.returncode == 2, r.stderr
    assert "no CUDA device is visible" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and not (tmp_path / "work").exists()


def test_its_table_slice_is_a_valid_overlay_of_the_paper_overlay():
    cfg = load(
        ROOT / "params.yaml",
        (ROOT / "workflow/configs/paper.yaml", ROOT / "workflow/configs/gpu_check.yaml"),
    )
    assert cfg["device"] == "cuda" and cfg["scale"] == "paper"
    table = cfg["tables"]["table1"]
    assert table["model"] == "resnet18" and cfg["models"]["resnet18"]["width"] == 64
    assert cfg["data"]["sources"]["patches"]["image_size"] == 64
    assert cfg["capture"]["victims"] == 2
    assert {cfg["attacks"][a]["restarts"] for a in table["attacks"]} == {4}  # the paper's


def test_the_project_copy_keeps_code_and_settings_and_leaves_outputs_behind(tmp_path, monkeypatch):
    src = tmp_path / "project"
    for f in (
        "Snakefile",
        "params.yaml",
        "src/gradinv/x.py",
        "workflow/rules/a.smk",
        "results/table1.csv",
        "data/prepared/p.pt",
        ".git/HEAD",
        ".venv/bin/python",
        "src/gradinv/__pycache__/x.pyc",
        "workflow/results/kept.txt",
    ):
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_text(f)
    monkeypatch.setattr(gpu_check, "ROOT", src)
    dst = gpu_check.copy_project(tmp_path / "work" / "project")
    copied = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    # Only the top-level outputs are left out; a nested folder of the same name is code.
    assert copied == [
        "Snakefile",
        "params.yaml",
        "src/gradinv/x.py",
        "workflow/results/kept.txt",
        "workflow/rules/a.smk",
    ]
    assert (dst / "data").is_dir() and (dst / "results").is_dir()
    (dst / "results" / "old.csv").write_text("stale")
    gpu_check.copy_project(dst)  # a second check starts from a fresh copy
    assert not (dst / "results" / "old.csv").exists()


def test_it_reads_the_device_each_job_logged_and_the_attack_seconds(tmp_path):
    logs = tmp_path / "logs"
    for name, text in {
        "attack/ig.log": "gradinv: device cuda:0 (NVIDIA H100)\nIG: 100 iterations\n",
        "capture/c.log": "gradinv: device cpu (device: auto, no GPU visible)\n",
        "score/s.log": "no device line: a CPU-only stage\n",
    }.items():
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_text(text)
    assert gpu_check.gpu_jobs(logs) == {"on_cuda": 1, "not_on_cuda": ["capture/c.log"]}
    bench = tmp_path / "bench" / "patches" / "ig"
    bench.mkdir(parents=True)
    (bench / "victims0-1.tsv").write_text("s\th:m:s\n12.345\t0:00:12\n")
    assert gpu_check.attack_seconds(tmp_path / "bench") == {"patches/ig/victims0-1": 12.3}
