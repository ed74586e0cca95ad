"""How fast the interactive commands answer, beside a bare ``import torch``, in one run.

    python benchmarks/interactive.py [--repeats 5] [--before REV] [--mlflow]
        [--out results/benchmarks/interactive]

Issue 33's targets: ``snakemake -n results/table1.csv`` at most as long as ``python -c "import
torch"`` on the same machine, and ``gradinv --help`` under a tenth of it. Each command runs
``--repeats`` times, interleaved (one round of every command, then the next round), in a copy of
the workflow in a temporary folder; the figures are medians of wall time and of peak memory (the
process's max RSS, GNU time's ``%M``). The dry run is measured warm: a first call checks
the configuration (its cross-checks load torch once per configuration and code,
:func:`gradinv.config.validate`) and is reported on its own line.

``--before REV`` also measures the dry run and ``--help`` at another commit, checked out in a
temporary git worktree and run with its ``src`` first on ``PYTHONPATH``, side by side in the same
rounds. ``--mlflow`` adds the seconds until ``mlflow ui`` on the project's store answers.

Snakemake imports every installed executor plugin; the SLURM plugin asks ``scontrol show
config`` at import, which waits about 9 s where a slurm.conf names a controller that is not
running (this machine after the SLURM tests): that import is measured on its own line, and the
dry run once more with a ``scontrol`` that fails at once (a shim first on PATH), as on a machine
without SLURM or with its controller up. Snakemake's own floor is measured too: the dry run of a
one-rule Snakefile that imports nothing of gradinv (with the shim).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SNAKEMAKE = [PY, "-m", "snakemake"]
TIME = "/usr/bin/time"  # GNU time: the peak RSS
ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}


def workflow_copy(source: Path, dest: Path) -> Path:
    """The files a Snakemake call reads, as a fresh clone has them."""
    dest.mkdir(parents=True)
    for name in ("Snakefile", "params.yaml", "environment.yml"):
        shutil.copy(source / name, dest / name)
    for folder in ("workflow", "profiles", "tests/configs"):
        shutil.copytree(source / folder, dest / folder)
    return dest


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB, GNU time's %M) of ``cmd``; fails loudly."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        start = time.perf_counter()
        proc = subprocess.run(
            [TIME, "-f", "%M", "-o", rss.name, *cmd],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        return wall, int(rss.read().split()[-1]) / 1024


def mlflow_answer_seconds(cwd: Path) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(Path(PY).with_name("mlflow")), "ui", "--backend-store-uri"]
    cmd += [f"sqlite:///{cwd / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port)]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while time.perf_counter() - start < 300:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                    if answer.status == 200:
                        return time.perf_counter() - start
            except OSError:
                time.sleep(0.2)
        raise SystemExit("mlflow ui did not answer in 300 s")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--before", help="a commit to measure side by side (git worktree)")
    p.add_argument("--mlflow", action="store_true", help="also time mlflow ui's first answer")
    p.add_argument("--out", default="results/benchmarks/interactive")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="interactive-") as tmp:
        tmp = Path(tmp)
        trees = {"now": (ROOT, ENV)}
        if a.before:
            tree = tmp / "before-src"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), a.before],
                check=True,
                capture_output=True,
            )
            env = {**ENV, "PYTHONPATH": f"{tree / 'src'}:{ENV.get('PYTHONPATH', '')}"}
            trees[a.before] = (tree, env)
        try:
            commands: dict[str, tuple[list[str], Path, dict[str, str]]] = {
                "import torch": ([PY, "-c", "import torch"], tmp, ENV),
                "import the SLURM executor plugin": (
                    [PY, "-c", "import snakemake_executor_plugin_slurm"],
                    tmp,
                    ENV,
                ),
            }
            # the same dry run where `scontrol` answers at once (a shim that fails), as on a
            # machine without SLURM or with its controller up: what the SLURM probe costs
            shim = tmp / "shim"
            shim.mkdir()
            (shim / "scontrol").write_text("#!/bin/sh\nexit 1\n")
            (shim / "scontrol").chmod(0o755)
            no_probe = {**ENV, "PATH": f"{shim}:{ENV['PATH']}"}
            # Snakemake alone: the dry run of a one-rule Snakefile, no gradinv in it (the floor
            # under any workflow's dry run on this machine)
            bare = tmp / "bare"
            bare.mkdir()
            (bare / "Snakefile").write_text(
                'rule a:\n    output: "a.txt"\n    shell: "touch {output}"\n'
            )
            commands["snakemake -n of a one-rule Snakefile (scontrol answering at once)"] = (
                [*SNAKEMAKE, "-n", "a.txt", "--quiet", "rules"],
                bare,
                no_probe,
            )
            first: dict[str, float] = {}
            for name, (tree, env) in trees.items():
                work = workflow_copy(tree, tmp / f"work-{name}")
                dry = [*SNAKEMAKE, "-n", "results/table1.csv", "--quiet", "rules"]
                first[name] = timed(dry, work, env)[0]  # checks the configuration once
                commands[f"snakemake -n results/table1.csv ({name})"] = (dry, work, env)
                help_cmd = [
                    PY,
                    "-c",
                    "import sys; from gradinv.cli import main; "
                    "sys.argv = ['gradinv', '--help']; main()",
                ]
                commands[f"gradinv --help ({name})"] = (help_cmd, work, env)
                if name == "now":
                    commands[
                        "snakemake -n results/table1.csv (now, scontrol answering at once)"
                    ] = (
                        dry,
                        work,
                        no_probe,
                    )
            samples: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
            for _ in range(a.repeats):
                for name, (cmd, cwd, env) in commands.items():
                    samples[name].append(timed(cmd, cwd, env))
            mlflow = mlflow_answer_seconds(tmp / "work-now") if a.mlflow else None
        finally:
            if a.before:
                subprocess.run(
                    [
                        "git",
                        "-C",
                        str(ROOT),
                        "worktree",
                        "remove",
                        "--force",
                        str(tmp / "before-src"),
                    ],
                    check=False,
                    capture_output=True,
                )
    torch_s = statistics.median(w for w, _ in samples["import torch"])
    rows = []
    for name, values in samples.items():
        wall = statistics.median(w for w, _ in values)
        rss = [m for _, m in values]
        rows.append(
            {
                "command": name,
                "median_s": round(wall, 3),
                "min_s": round(min(w for w, _ in values), 3),
                "max_s": round(max(w for w, _ in values), 3),
                "peak_rss_mib": round(statistics.median(rss), 1),
                "ratio_to_import_torch": round(wall / torch_s, 3),
                "n": len(values),
            }
        )
    result = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
        ).stdout.strip(),  # "<commit>-dirty" when the working tree has changes
        "machine": f"{os.cpu_count()} CPUs, {sys.platform}",
        "repeats": a.repeats,
        "first_dry_run_s": {k: round(v, 3) for k, v in first.items()},
        "mlflow_ui_first_answer_s": None if mlflow is None else round(mlflow, 2),
        "rows": rows,
        "targets": {
            "snakemake -n <= import torch": rows_named(rows, "snakemake -n", "(now)") <= 1.0,
            "gradinv --help < import torch / 10": rows_named(rows, "gradinv --help", "(now)") < 0.1,
        },
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "| command | median s | min-max s | median peak RSS MiB | x import torch | n |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['command']} | {r['median_s']} | {r['min_s']}-{r['max_s']} | "
            f"{r['peak_rss_mib']} | {r['ratio_to_import_torch']} | {r['n']} |"
        )
    text = "\n".join(lines)
    text += f"\n\nfirst dry run (checks the configuration): {result['first_dry_run_s']}"
    if mlflow is not None:
        text += f"\nmlflow ui answered after {result['mlflow_ui_first_answer_s']} s"
    text += f"\ntargets met: {result['targets']}\n"
    out.with_suffix(".md").write_text(text)
    print(text)


def rows_named(rows: list[dict], prefix: str, suffix: str) -> float:
    return next(
        r["ratio_to_import_torch"]
        for r in rows
        if r["command"].startswith(prefix) and r["command"].endswith(suffix)
    )


if __name__ == "__main__":
    main()
