"""MLflow on a cluster: jobs log over HTTP to a tracking server backed by PostgreSQL.

docs/cluster.md ("Running on a cluster") starts ``mlflow server`` with a PostgreSQL database as its
store and sets ``tracking.uri`` to the server's address, so that jobs on many nodes never write one
SQLite file. This test does the same on this machine: PostgreSQL from Debian's packages
(installed where missing, so it needs root and apt, as in CI; elsewhere it is skipped with the
reason), a database cluster of its own in a temporary folder on free ports, the project's
``mlflow server`` on it, and the micro Table I run twice by Snakemake: once with each job logging
its run as it ends (``defer: false``, what a cluster's jobs do) and once deferred (the default:
the runs are logged to the server when the workflow ends). The daemons it started are stopped
by their pids.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services import apt_install, free_port, mlflow_server
from test_workflow import run_folder, workflow_copy

pytestmark = pytest.mark.slow

MICRO = "tests/configs/micro.yaml"


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


def _install_postgres() -> Path:
    """Debian's PostgreSQL, without the default cluster its package would create and start."""
    conf = Path("/etc/postgresql-common/createcluster.conf")
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists():
        conf.write_text("create_main_cluster = false\n")
    apt_install("postgresql")
    found = _postgres_bin()
    assert found, "apt-get installed postgresql, but no /usr/lib/postgresql/*/bin/postgres"
    return found


def _stop(pid: int, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise AssertionError(f"process {pid} did not stop within {timeout} s")


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL server of the test's own: its database URL."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("PostgreSQL from Debian's packages needs root and apt-get (as in CI)")
    bindir = _postgres_bin() or _install_postgres()
    data = Path(tempfile.mkdtemp(prefix="gradinv-pg-"))
    shutil.chown(data, "postgres", "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run(
        [*as_postgres, bindir / "initdb", "-D", data / "db", "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = [*as_postgres, bindir / "pg_ctl", "-D", data / "db"]
    subprocess.run(
        [*pg_ctl, "-o", options, "-l", data / "log", "-w", "start"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pid = int((data / "db" / "postmaster.pid").read_text().split()[0])
    try:
        subprocess.run(
            [*as_postgres, bindir / "createdb", "-h", "127.0.0.1", "-p", str(port), "mlflow"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        _stop(pid, signal.SIGINT)  # PostgreSQL's fast shutdown, of the server this started
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def tracking_server(postgres: str, tmp_path_factory) -> Iterator[str]:
    """``mlflow server`` on that database, as docs/cluster.md starts it: its http:// address."""
    log = tmp_path_factory.mktemp("mlflow-server") / "server.log"
    with mlflow_server(postgres, "--no-serve-artifacts", log=log, timeout=180) as uri:
        yield uri


def _runs(uri: str, experiment: str) -> dict[str, list[tuple[int, float]]]:
    """The experiment's runs on the server: job key -> its PSNR history ((step, value) pairs;
    a score job logs one value per victim)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} on {uri}"
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    return {
        r.data.tags["gradinv.job_key"]: sorted(
            (m.step, m.value) for m in client.get_metric_history(r.info.run_id, "psnr")
        )
        for r in runs
    }


def test_jobs_log_to_a_postgres_backed_server_live_and_deferred(tracking_server, tmp_path):
    logged = {}
    for defer in (False, True):
        root = workflow_copy(tmp_path / f"defer-{defer}")
        experiment = f"micro-defer-{defer}"
        (root / "server.yaml").write_text(
            f"tracking: {{uri: '{tracking_server}', defer: {str(defer).lower()}, "
            f"experiment: {experiment}}}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRADINV_TRACKING")}
        overlays = ["--configfile", MICRO, "server.yaml"]
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", "results/table1.csv", "--cores", "2", *overlays],
            cwd=root,
            env={**env, "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"},
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert not (root / "mlflow.db").exists()  # nothing went to a SQLite file
        pending = root / "mlflow-pending"
        assert not pending.exists() or not any(pending.iterdir())  # every run reached it
        logged[defer] = _runs(tracking_server, experiment)
        artifacts = list((root / "mlartifacts").rglob("*"))  # on the shared project folder
        assert any(p.is_file() for p in artifacts)
    live, deferred = logged[False], logged[True]
    assert live and sorted(live) == sorted(deferred)  # one run per logging job, both ways
    attacks = [k for k in live if k.startswith("attack/")]  # the score jobs' runs
    assert attacks and any(k.startswith("train/") for k in live)
    differ = {k: (live[k], deferred[k]) for k in attacks if not live[k] or live[k] != deferred[k]}
    assert not differ, differ
    runs = [run_folder(tmp_path / f"defer-{d}", MICRO) for d in (False, True)]
    tables = [(run / "results/table1.csv").read_bytes() for run in runs]
    assert tables[0] == tables[1]
