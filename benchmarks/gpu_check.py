"""``make gpu-check``: does the pipeline run on a GPU, and how fast are its GPU paths?

    python benchmarks/gpu_check.py [--out results/benchmarks/gpu_check.json] [--cores N]
        [--parts table restarts censor] [--workdir results/gpu_check]

One run on one GPU, three parts, one file of figures. Measured with the settings below on an
H200 (docs/runs/2026-11-27-gpu-check-h200.md): 416 s in all, the table 343 s, the restarts 47 s,
CENSOR 26 s; the earlier runs are docs/runs/2026-11-26-gpu-check-{h100,h200}.md.

1. ``table``: the paper overlay's Table I on a thin slice, run by Snakemake as a user runs it
   (``snakemake results/table1.csv --configfile workflow/configs/paper.yaml
   workflow/configs/gpu_check.yaml``): ResNet-18 at 64x64 with 4 restarts of every attack, No
   Defense and CENSOR, IG, GI, GGL, GIAS and GIFD, 2 victims, short budgets, ``device: cuda``
   (the overlay says why each setting). It runs in a copy of the project under ``--workdir`` so
   that the project's own results are untouched. Reported: the exit status, the wall time, the
   jobs, the seconds of each attack job (its ``benchmark:`` file), whether every GPU job's log
   says it ran on CUDA, and the table's PSNR cells.
2. ``restarts``: ``benchmarks/restarts.py --devices cuda --models resnet18 --sizes 64`` (IG, 4
   restarts in one vmap pass against 1 restart; target: at most 1.5x), and its check that both
   layouts compute the same.
3. ``censor``: ``benchmarks/censor.py --devices cuda --sizes 64 --no-selection`` (a CENSOR
   update with T = 20 against an undefended one; target: at most 2x), and its check that both
   evaluation paths select the same candidate.

Exit status: 0 when every part ran and its correctness check passed (a missed speed target is
reported as missed, not as an error); 1 when a part failed; 2, before anything runs, when no
CUDA device is visible. The figures go to ``--out`` (JSON) and a Markdown summary beside it
(``.md``); each part's own output is kept under ``--workdir``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from full_scale import load_config  # beside this script, in benchmarks/

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
OVERLAYS = ["workflow/configs/paper.yaml", "workflow/configs/gpu_check.yaml"]
PARTS = ("table", "restarts", "censor")
TIMEOUT_S = {"table": 480, "restarts": 120, "censor": 120}  # 2 victims: about 6-7 min
TARGETS = {"restarts": 1.5, "censor": 2.0}
# What the project copy leaves out: the version control, environments, caches and every output.
NOT_COPIED = {
    ".git",
    ".venv",
    ".whl",
    ".gl",
    ".snakemake",
    ".pytest_cache",
    ".ruff_cache",
    ".dvc",
    "results",
    "data",
    "runs",
    "mlruns",
    "mlartifacts",
    "mlflow.db",
    "mlflow.db.pending",
    "mlflow-pending",
    "docs",
    "tests",
}


def cuda_device() -> dict[str, Any] | None:
    """The GPU this run would use, or None when PyTorch sees none."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_mib": props.total_memory // 2**20,
        "capability": f"{props.major}.{props.minor}",
        "count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def copy_project(dst: Path) -> Path:
    """A fresh copy of the project's code and settings at ``dst`` (replacing an older one), with
    empty ``data/`` and ``results/``: the check's jobs write there, never into the project."""
    if dst.exists():
        shutil.rmtree(dst)

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder).resolve() == ROOT
        return {n for n in names if n == "__pycache__" or (top and n in NOT_COPIED)}

    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)
    (dst / "data").mkdir()
    (dst / "results").mkdir()
    return dst


def job_environment() -> dict[str, str]:
    """The jobs find ``gradinv`` and ``snakemake`` beside this Python, as in the project's
    environment, and run with telemetry off."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("GRADINV_PROJECT_ROOT", None)  # the copy's Snakefile sets its own
    env.update(MLFLOW_DISABLE_TELEMETRY="true", DVC_NO_ANALYTICS="1", PYTHONUNBUFFERED="1")
    return env


def run_logged(cmd: list[str], cwd: Path, log: Path, timeout: float) -> tuple[int, float]:
    """Run ``cmd`` with its output in ``log``; its exit status (124 when it ran out of time) and
    wall seconds."""
    start = time.perf_counter()
    with log.open("w") as out:
        try:
            rc = subprocess.run(
                cmd,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=job_environment(),
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, round(time.perf_counter() - start, 1)


def tail(path: Path, lines: int = 25) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def table_part(work: Path, cores: int, extra: list[str]) -> dict[str, Any]:
    project = copy_project(work / "project")
    log = work / "table.log"
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "results/table1.csv",
        "--cores",
        str(cores),
        "--configfile",
        *OVERLAYS,
        *[str(Path(f).resolve()) for f in extra],
    ]
    rc, wall = run_logged(cmd, project, log, TIMEOUT_S["table"])
    run = project / load_config(OVERLAYS)["run_dir"]  # where the overlays' jobs write
    done = re.findall(r"(\d+) of (\d+) steps", log.read_text(errors="replace"))
    report: dict[str, Any] = {
        "command": " ".join(cmd[1:]).replace(sys.executable, "python"),
        "exit_status": rc,
        "wall_s": wall,
        "jobs_done": int(done[-1][0]) if done else 0,
        "jobs": int(done[-1][1]) if done else None,
        "attack_job_s": attack_seconds(run / "results" / "benchmarks" / "attack"),
        "gpu_jobs": gpu_jobs(run / "results" / "logs"),
    }
    table = run / "results" / "table1.csv"
    if rc == 0 and table.exists():
        report["psnr"] = psnr_cells(table)
    else:
        report["log_tail"] = tail(log)
    on_cuda = report["gpu_jobs"]["on_cuda"] > 0 and report["gpu_jobs"]["not_on_cuda"] == []
    report["passed"] = rc == 0 and "psnr" in report and (on_cuda or bool(extra))
    return report


def attack_seconds(folder: Path) -> dict[str, float]:
    """Each attack job's own seconds (its ``benchmark:`` file), keyed by its path."""
    seconds = {}
    for tsv in sorted(folder.rglob("*.tsv")):
        rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
        if rows:
            seconds[str(tsv.relative_to(folder).with_suffix(""))] = round(float(rows[-1]["s"]), 1)
    return seconds


def gpu_jobs(logs: Path) -> dict[str, Any]:
    """The job logs that name a device: which say they ran on CUDA, and which do not."""
    on, off = [], []
    for log in sorted(logs.rglob("*.log")):
        text = log.read_text(errors="replace")
        found = re.findall(r"gradinv: device (cuda:\d+|cpu)\b", text)
        if found:
            (on if all(d.startswith("cuda") for d in found) else off).append(
                str(log.relative_to(logs))
            )
    return {"on_cuda": len(on), "not_on_cuda": off}


def psnr_cells(table: Path) -> list[dict[str, str]]:
    """Each (defense, attack) cell's PSNR: mean, 95% interval and n (columns "<attack> PSNR↓ …")."""
    cells = []
    for row in csv.DictReader(table.open()):
        for key in row:
            if m := re.fullmatch(r"(.+) PSNR\S* mean", key):
                stem = key.removesuffix(" mean")
                cells.append(
                    {
                        "defense": row["defense"],
                        "attack": m.group(1),
                        "psnr_mean": row[key],
                        "ci_95": f"[{row[stem + ' ci_low']}, {row[stem + ' ci_high']}]",
                        "n": row[stem + " n"],
                    }
                )
    return cells


def benchmark_args(name: str, device: str) -> list[str]:
    """The paper's image size on ``device``; on the CPU (``--allow-cpu``) the smallest runs."""
    cpu = device == "cpu"
    if name == "restarts":
        return ["--devices", device, "--models", "resnet18", "--sizes", "64"] + ["--quick"] * cpu
    return ["--devices", device, "--sizes", "64", "--no-selection"] + [
        "--repeats",
        "1",
        "--trials",
        "4",
    ] * cpu


def benchmark_part(name: str, device: str, work: Path) -> dict[str, Any]:
    """One of the benchmark scripts on CUDA; its JSON report and the figure behind the target."""
    log = work / f"{name}.log"
    args = benchmark_args(name, device)
    rc, wall = run_logged(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args], ROOT, log, TIMEOUT_S[name]
    )
    out = ROOT / "results" / "benchmarks" / f"{name}.json"
    report: dict[str, Any] = {"exit_status": rc, "wall_s": wall, "args": args}
    if rc not in (0, 1) or not out.exists():  # 1: ran, but its correctness check failed
        report |= {"passed": False, "log_tail": tail(log)}
        return report
    raw = json.loads(out.read_text())
    shutil.copy(out, work / out.name)
    cuda = [r for r in raw["speed"] if r["device"] == device]
    if name == "restarts":
        ratios = [(r["model"], r["image_size"], r["batched_over_one_restart"]) for r in cuda]
        report["correctness_passed"] = raw["correctness"]["passed"]
    else:
        ratios = [("resnet18", r["image_size"], r["batched_over_undefended"]) for r in cuda]
        ratios += [
            (
                "resnet18, draws: device",
                r["image_size"],
                r["device_draws_over_undefended"],
            )
            for r in cuda
            if "device_draws_over_undefended" in r
        ]
        report["correctness_passed"] = all(r["same_candidate_selected"] for r in raw["speed"])
    report["speed"] = cuda
    report["target"] = TARGETS[name]
    report["ratios"] = [
        {"case": m, "image_size": s, "ratio": x, "target_met": x <= TARGETS[name]}
        for m, s, x in ratios
    ]
    report["passed"] = rc == 0 and report["correctness_passed"]
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# gpu-check, {report['when']}", ""]
    gpu = report["gpu"]
    lines += [
        f"{gpu['name']} ({gpu['memory_mib']} MiB), PyTorch {gpu['torch']}, CUDA "
        f"{gpu['cuda']}, {report['cpu_count']} CPU cores. Exit status "
        f"{report['exit_status']}"
        + (f" (not run yet: {', '.join(w)})" if (w := report.get("parts_not_run_yet")) else "")
        + ".",
        "",
    ]
    if t := report["parts"].get("table"):
        lines += [
            f"## Table I, thin slice: {'passed' if t['passed'] else 'FAILED'}",
            "",
            f"`{t['command']}`: exit {t['exit_status']}, {t['wall_s']} s, "
            f"{t['jobs_done']} of {t['jobs']} jobs; {t['gpu_jobs']['on_cuda']} job logs "
            f"on CUDA, not on CUDA: {t['gpu_jobs']['not_on_cuda'] or 'none'}.",
            "",
        ]
        if t.get("psnr"):
            keys = list(t["psnr"][0])
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in t["psnr"]]
            lines.append("")
    for name in ("restarts", "censor"):
        if b := report["parts"].get(name):
            lines += [
                f"## {name}: {'passed' if b['passed'] else 'FAILED'} "
                f"(exit {b['exit_status']}, {b['wall_s']} s)",
                "",
            ]
            for r in b.get("ratios", []):
                met = "met" if r["target_met"] else "missed"
                lines.append(
                    f"- {r['case']}, {r['image_size']}x{r['image_size']}: "
                    f"{r['ratio']}x (target {b['target']}x: {met})"
                )
            lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "results/benchmarks/gpu_check.json")
    p.add_argument("--workdir", type=Path, default=ROOT / "results/gpu_check")
    p.add_argument("--cores", type=int, default=min(os.cpu_count() or 1, 8))
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="a wiring check of this script on a machine without a GPU: the table "
        "with --configfile overlays (device: cpu, tiny budgets), the benchmarks' "
        "--quick runs on the CPU; it checks nothing about GPUs",
    )
    p.add_argument(
        "--configfile",
        nargs="*",
        default=[],
        help="overlays after the check's own (with --allow-cpu)",
    )
    a = p.parse_args()
    import torch  # after the arguments: --help needs no torch

    gpu = cuda_device()
    if gpu is None and a.allow_cpu:
        gpu = {
            "name": "none (--allow-cpu: a wiring check on the CPU)",
            "memory_mib": 0,
            "torch": torch.__version__,
            "cuda": None,
        }
    elif gpu is None:
        print(
            "gpu-check: no CUDA device is visible (torch.cuda.is_available() is False), so "
            "nothing was run. Run it on a machine with an NVIDIA GPU and a CUDA build of "
            "PyTorch (`python -c 'import torch; print(torch.version.cuda)'` must not print "
            "None); on a cluster, inside a job that was given a GPU.",
            file=sys.stderr,
        )
        return 2
    work = a.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "parts": {},
    }
    for part in a.parts:
        print(f"gpu-check: {part} ...", flush=True)
        if part == "table":
            report["parts"][part] = table_part(work, a.cores, a.configfile)
        else:
            device = "cpu" if gpu["cuda"] is None else "cuda"
            report["parts"][part] = benchmark_part(part, device, work)
        print(
            f"gpu-check: {part} {'passed' if report['parts'][part]['passed'] else 'FAILED'}",
            flush=True,
        )
        unfinished = [p for p in a.parts if p not in report["parts"]]
        report["parts_not_run_yet"] = unfinished  # a check cut short keeps what it measured
        report["exit_status"] = None if unfinished else exit_status(report)
        write_report(report, a.out.resolve())
    print(markdown(report))
    return report["exit_status"]


def exit_status(report: dict[str, Any]) -> int:
    return 0 if all(r["passed"] for r in report["parts"].values()) else 1


def write_report(report: dict[str, Any], out: Path) -> None:
    """The JSON report and its Markdown summary, each written whole (temporary file, rename);
    written after every part, so that a check stopped midway keeps the parts it finished."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in (
        (out, json.dumps(report, indent=2) + "\n"),
        (out.with_suffix(".md"), markdown(report)),
    ):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
