"""The pipeline on a real SLURM cluster through profiles/slurm (snakemake-executor-plugin-slurm).

A single-node SLURM with accounting (slurmdbd on MariaDB) and two declared GPUs (gres whose
device files are links to /dev/null) is brought up by tests/slurm/start-slurm.sh, which installs
Debian's packages where they are missing: this needs root and apt, as in CI; elsewhere the tests
are skipped with the reason. The daemons the fixture started are stopped by their pids.

The micro overlay's Table I runs with ``cluster.gpus: true``: the jobs compute on the CPU
(``device: cpu``) but training, capture and attack jobs still ask SLURM for a GPU, so the gres
path is exercised without one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradinv.pipeline import finished_outputs
from services import SLURM_CONFIGS
from test_workflow import run_folder, workflow_copy

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "slurm" / "start-slurm.sh"
PIDS = [
    Path(p)
    for p in (
        "/run/slurm/slurmctld.pid",
        "/run/slurm/slurmd.pid",
        "/run/slurm/slurmdbd.pid",
        "/run/mysqld/mysqld.pid",
        "/run/munge/munged.pid",
    )
]
MICRO = "tests/configs/micro.yaml"
GPU_OVERLAY = "cluster: {gpus: true}\n"


def _alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def _env() -> dict[str, str]:
    """The environment without the test's tracking store: each project logs to its own."""
    env = {k: v for k, v in os.environ.items() if k != "GRADINV_TRACKING_URI"}
    return {**env, "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> dict[str, float]:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("a real SLURM needs root and apt-get (as in CI)")
    before = {p: _alive(p) for p in PIDS}
    configured = {conf: conf.exists() for conf in SLURM_CONFIGS}
    start = time.monotonic()
    subprocess.run(
        ["bash", str(SCRIPT), "start"],
        env={**os.environ, "SLURM_ACCOUNTING": "1", "SLURM_FAKE_GPUS": "2"},
        check=True,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )
    figures = {"cluster_start_s": round(time.monotonic() - start, 1)}
    started = {p: _alive(p) for p in PIDS if before[p] is None and _alive(p)}
    yield figures
    for pid in started.values():  # the daemons this fixture started, and only those
        os.kill(pid, 15)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in started if _alive(p)]
    # and the configuration it wrote: with a slurm.conf naming a controller that is down, every
    # `scontrol` (which the SLURM executor plugin runs when Snakemake starts) waits ~9 s
    for conf, existed in configured.items():
        if not existed:
            conf.unlink(missing_ok=True)
    print(json.dumps(figures))


def _project(tmp_path: Path) -> Path:
    root = workflow_copy(tmp_path)
    (root / "gpu.yaml").write_text(GPU_OVERLAY)
    return root


def _snakemake(root: Path, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "results/table1.csv", *args],
        cwd=root,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


SLURM = ["--profile", "profiles/slurm", "--slurm-init-seconds-before-status-checks", "1"]
OVERLAYS = ["--configfile", MICRO, "gpu.yaml"]


def _submitted(log: str) -> dict[str, str]:
    """SLURM job id -> what it ran (rule_<name> or group_<name>), from Snakemake's log."""
    found = re.findall(r"with SLURM jobid (\d+) \(log: .*?/slurm_logs/([^/]+)/", log)
    return dict(found)


def _sacct(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """State and allocated resources of each job, from SLURM's accounting."""
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "--format=JobID,State,AllocTRES"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line]
    return {r[0]: {"state": r[1], "tres": r[2]} for r in rows}


def _mlflow_runs(root: Path) -> int:
    with sqlite3.connect(root / "mlflow.db") as db:
        return db.execute("select count(*) from runs").fetchone()[0]


def test_the_micro_table_through_slurm_is_the_local_table(cluster, tmp_path):
    local, remote = _project(tmp_path / "local"), _project(tmp_path / "slurm")
    start = time.monotonic()
    proc = _snakemake(local, "--cores", "2", *OVERLAYS)
    local_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = time.monotonic()
    proc = _snakemake(remote, *SLURM, *OVERLAYS)
    slurm_s = time.monotonic() - start
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]

    table = (run_folder(local, MICRO) / "results/table1.csv").read_bytes()
    assert (run_folder(remote, MICRO) / "results/table1.csv").read_bytes() == table
    jobs = int(re.search(r"^total\s+(\d+)", log, re.M).group(1))
    submitted = _submitted(log)
    accounted = _sacct(list(submitted))
    assert sorted(accounted) == sorted(submitted)  # every submission went through sbatch
    assert {row["state"] for row in accounted.values()} == {"COMPLETED"}
    trains = [accounted[j] for j, what in submitted.items() if what == "rule_train"]
    assert trains and all("gres/gpu=1" in row["tres"] for row in trains)
    groups = [accounted[j] for j, what in submitted.items() if what.startswith("group_cell")]
    assert groups and all("gres/gpu=1" in row["tres"] for row in groups)
    assert _mlflow_runs(remote) == _mlflow_runs(local) > 0  # one run per logging job
    cluster.update(
        local_s=round(local_s, 1),
        slurm_s=round(slurm_s, 1),
        jobs=jobs,
        submissions=len(submitted),
        group_submissions=len(groups),
    )


def test_a_cancelled_job_is_rerun_and_nothing_finished_recomputed(cluster, tmp_path):
    root = _project(tmp_path)
    out = run_folder(root, MICRO)  # where the micro overlay's jobs write
    args = [sys.executable, "-m", "snakemake", "results/table1.csv", *SLURM, *OVERLAYS]
    run = subprocess.Popen(
        args, cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline, victim = time.monotonic() + 600, None
    while victim is None:
        assert run.poll() is None and time.monotonic() < deadline
        queue = subprocess.run(
            ["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True
        ).stdout
        running = [line.split("|") for line in queue.splitlines() if "|RUNNING|" in line]
        victim = next((r[0] for r in running if r[2].startswith("rule_train")), None)
        time.sleep(0.5)
    subprocess.run(["scancel", victim], check=True)
    log, _ = run.communicate(timeout=1200)
    assert run.returncode != 0 and "CANCELLED" in log, log[-3000:]
    before = finished_outputs(out)
    assert before and not (out / "results/table1.csv").exists()

    proc = _snakemake(root, *SLURM, *OVERLAYS)  # the same command again
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    after = finished_outputs(out)
    assert [p for p, mtime in before.items() if after.get(p) != mtime] == []
    assert (out / "results/table1.csv").exists()
    cluster.update(cancelled_job=victim, kept_outputs=len(before))


def _start_now(job: str) -> None:
    """Let a requeued job start again at once. Once its first run has stopped (COMPLETING), SLURM
    holds it pending for 2 minutes (its begin time: requeued at 10:59:36, allocated again at
    11:01:37, in slurmctld's log on 2026-11-30): SLURM's policy, not what the test checks. An
    administrator may move the begin time, as here; the job then starts within a second."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T|%r"], capture_output=True, text=True
        ).stdout.strip()
        if state.startswith("RUNNING") or not state:
            return  # started again already (a SLURM without the hold), or finished
        if state == "PENDING|BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
            return
        time.sleep(0.2)


# 600 rounds of the micro CNN (seconds), the last one saved; progress saved every round
LONG_TRAINING = "fl: {rounds: 600, checkpoint_rounds: [0, 4, 600]}\nprogress: {every_seconds: 0}\n"


def test_a_requeued_training_job_resumes_from_its_progress(cluster, tmp_path):
    """SLURM requeues a running job (as after a node failure with --slurm-requeue, or a
    preemption): the job starts again on a node and resumes from its progress file, and the
    checkpoints are those of a run never interrupted."""
    runs, seconds = {}, {}
    for name in ("plain", "requeued"):  # the plain run locally, the requeued one through SLURM
        root = _project(tmp_path / name)
        (root / "long.yaml").write_text(LONG_TRAINING)
        target = "results/train/patches/cnn3/none/summary.json"
        how = ["--cores", "2"] if name == "plain" else SLURM
        args = [sys.executable, "-m", "snakemake", target, *how, *OVERLAYS, "long.yaml"]
        start = time.monotonic()
        run = subprocess.Popen(
            args, cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        progress = run_folder(root, MICRO) / "results/.progress/train/patches/cnn3/none"
        requeued = None
        while name == "requeued" and requeued is None:
            assert run.poll() is None, run.communicate()[0][-3000:]
            queue = subprocess.run(
                ["squeue", "-h", "-o", "%i|%T|%k"], capture_output=True, text=True
            ).stdout
            rows = [r.split("|") for r in queue.splitlines()]
            running = [r[0] for r in rows if r[1] == "RUNNING" and r[2].startswith("rule_train")]
            job = running[0] if running else None
            # the loop's state (state.pt, saved after each round), not only the round-0 model
            # the loop saves first: a requeue before the first state.pt restarts from round 0
            if job and any(p.name == "state.pt" for p in progress.rglob("*.pt")):
                subprocess.run(["scontrol", "requeue", job], check=True)
                requeued = job
                _start_now(job)
            time.sleep(0.3)
        log, _ = run.communicate(timeout=1200)
        assert run.returncode == 0, log[-3000:]
        runs[name], seconds[name] = run_folder(root, MICRO), round(time.monotonic() - start, 1)
    root = runs["requeued"]
    job_log = (root / "results/logs/train/patches/cnn3/none.log").read_text()
    assert "resuming from saved progress" in job_log, job_log[-2000:]
    for ckpt in sorted((runs["plain"] / "results/checkpoints").rglob("*.pt")):
        other = root / ckpt.relative_to(runs["plain"])
        assert other.read_bytes() == ckpt.read_bytes(), ckpt.name
    from gradinv.cluster import sacct_states  # what onerror asks SLURM after a failure

    assert sacct_states([requeued]) == {requeued: "COMPLETED"}
    cluster.update(
        requeued_job=requeued, plain_local_s=seconds["plain"], requeued_slurm_s=seconds["requeued"]
    )
