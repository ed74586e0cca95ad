"""Kill a Snakemake run part-way, rerun the same command, and count what was lost or redone.

    python benchmarks/kill_and_resume.py results/table1.csv --cores 4 --signal KILL --after 10

Starts ``snakemake TARGET --cores N`` in its own process group, waits until ``--after`` metrics
files exist, sends the signal to the whole group (as a terminal's Ctrl-C or a batch system's kill
would), records every output Snakemake had marked complete, then reruns the same command to the
end. Reports, as JSON on stdout and in results/benchmarks/kill_and_resume.json:

- finished_before_kill: outputs complete when the run was killed;
- recomputed_after_resume: those of them rewritten by the rerun (should be 0);
- temporary_files_left: ``*.tmp`` files under results/ after the rerun (should be 0);
- mlflow_runs / jobs_that_log: MLflow runs (active) against training + scoring jobs, and
  duplicate job keys (should be equal, and 0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from gradinv.pipeline import finished_outputs


def mlflow_runs(root: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(root / "mlflow.db") as db:
        return db.execute(
            "select k.value, j.value from runs r "
            "join tags k on r.run_uuid = k.run_uuid and k.key = 'gradinv.kind' "
            "join tags j on r.run_uuid = j.run_uuid and j.key = 'gradinv.job_key' "
            "where r.lifecycle_stage = 'active'"
        ).fetchall()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("--cores", default="2")
    p.add_argument("--signal", choices=["INT", "KILL", "TERM"], default="KILL")
    p.add_argument("--after", type=int, default=10, help="kill once this many metrics exist")
    p.add_argument("snakemake_args", nargs="*", help="extra arguments, after --")
    a = p.parse_args()
    root = Path.cwd()
    cmd = [sys.executable, "-m", "snakemake", a.target, "--cores", a.cores, *a.snakemake_args]

    started = time.monotonic()
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
    metrics = root / "results" / "metrics"
    while len(list(metrics.rglob("*.json"))) < a.after:
        if proc.poll() is not None:
            print("the run ended before the kill; use a larger --after", file=sys.stderr)
            return 1
        time.sleep(0.5)
    os.killpg(proc.pid, getattr(signal, f"SIG{a.signal}"))
    proc.wait()
    killed_after = time.monotonic() - started
    time.sleep(1.0)
    before = finished_outputs(root)

    started = time.monotonic()
    rerun = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    resume_seconds = time.monotonic() - started
    after = finished_outputs(root)
    runs = mlflow_runs(root)
    report = {
        "command": " ".join(cmd[2:]),
        "signal": f"SIG{a.signal}",
        "killed_after_s": round(killed_after, 1),
        "resume_exit_code": rerun.returncode,
        "resume_s": round(resume_seconds, 1),
        "finished_before_kill": len(before),
        "recomputed_after_resume": sum(after.get(k) != v for k, v in before.items()),
        "outputs_after_resume": len(after),
        "temporary_files_left": len(list((root / "results").rglob("*.tmp"))),
        "jobs_that_log": len(list((root / "results/train").rglob("summary.json")))
        + len(list(metrics.rglob("*.json"))),
        "mlflow_runs": len(runs),
        "duplicate_job_keys": len(runs) - len({key for _, key in runs}),
    }
    out = root / "results" / "benchmarks" / "kill_and_resume.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if rerun.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
