"""What MLflow tracking costs a job: logged as the job ends (``tracking.defer: false``) or
saved for the workflow's flush (``defer: true``, the default)?

    python benchmarks/tracking.py [--repeats 5] [--flush-runs 50]

Per job. Each repeat starts a fresh Python process, as Snakemake starts every job, which imports
torch (every job does) and calls :func:`gradinv.stages.tracking.log_job` with what a score job
logs: 40 nested params, 12 metrics, a 300-step loss history and two 32x32 images. Three
processes per repeat, side by side in alternating order: tracking off (the floor), immediate
(imports MLflow and writes the run to a fresh SQLite store under its lock) and deferred (writes
the pending file). Reported: the median wall seconds of each process, and what tracking adds
over the floor, immediate against deferred.

Flush. ``--flush-runs`` deferred runs are then logged by one :func:`gradinv.tracking.
flush_pending` in one process; reported: its wall seconds (MLflow's import included) and the
seconds per run. That is the serial time the workflow's end pays, once, instead of an import
per job.

Stores live in a temporary folder; nothing of the project's is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """
import sys, time, numpy as np, torch
from gradinv.stages.tracking import log_job
rng = np.random.default_rng(0)
params = {f"group{g}": {f"p{i}": float(i) for i in range(10)} for g in range(4)}
metrics = {f"m{i}": float(rng.random()) for i in range(12)}
history = {"loss": [(s, float(v)) for s, v in enumerate(rng.random(300))]}
images = {"original": torch.rand(3, 32, 32), "reconstruction": torch.rand(3, 32, 32)}
assert log_job({"scale": "embedded", "seed": 0}, kind="attack", run_name=sys.argv[1],
    job_key="job/" + sys.argv[1], params=params, metrics=metrics, history=history,
    summary={}, images=images) is not None or sys.argv[2] == "off"
"""

FLUSH = """
from pathlib import Path
from gradinv.tracking import flush_pending
logged, failed = flush_pending(Path.cwd())
assert not failed, failed
print(logged)
"""


def run(code: str, args: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, check=True)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--flush-runs", type=int, default=50)
    a = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = {**os.environ, "GRADINV_PROJECT_ROOT": tmp, "MLFLOW_DISABLE_TELEMETRY": "true"}
        base.pop("GRADINV_TRACKING_URI", None)
        base.pop("GRADINV_ARTIFACT_ROOT", None)
        modes = {
            "off": {**base, "GRADINV_TRACKING": "off"},
            "immediate": {**base, "GRADINV_TRACKING_DEFER": "false"},
            "deferred": {**base, "GRADINV_TRACKING_DEFER": "true"},
        }
        run(
            "from gradinv.tracking import init_store; from pathlib import Path; "
            "init_store(Path.cwd(), 'gradinv')",
            [],
            modes["immediate"],
            root,
        )  # the schema
        seconds: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(a.repeats):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for mode in order:
                seconds[mode].append(run(JOB, [f"{mode}{r}", mode], modes[mode], root))
        med = {m: statistics.median(s) for m, s in seconds.items()}

        for i in range(a.flush_runs - sum(m == "deferred" for m in modes) * a.repeats):
            run(JOB, [f"extra{i}", "deferred"], modes["deferred"], root)
        pending = len(list((root / "mlflow.db.pending").glob("*.json")))
        flush = run(FLUSH, [], modes["deferred"], root)

    print(f"per job, median of {a.repeats} processes each (torch imported in all):")
    for mode in modes:
        runs = ", ".join(f"{s:.2f}" for s in seconds[mode])
        print(f"  {mode:>9}: {med[mode]:.2f} s   ({runs})")
    added = {m: med[m] - med["off"] for m in ("immediate", "deferred")}
    print(
        f"  tracking adds {added['immediate']:.2f} s logged at once, {added['deferred']:.2f} s "
        f"deferred; a deferred job takes {med['deferred'] / med['immediate']:.2f}x the time"
    )
    print(
        f"flush: {pending} pending runs in {flush:.1f} s, {flush / max(pending, 1):.2f} s per run"
    )
    print(json.dumps({"median_s": med, "flush_s": flush, "flush_runs": pending}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
