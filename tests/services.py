"""What the tests that start services share: a free port, Debian packages installed where
missing (root and apt, as in CI), and an ``mlflow server`` started, awaited and stopped by the
pid of its process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MLFLOW = Path(sys.executable).with_name("mlflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def apt_install(*packages: str) -> None:
    """Install Debian ``packages`` (no recommends), quietly; fails loudly."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        check=True,
        env=env,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )


@contextmanager
def mlflow_server(
    backend: str, *options: str, log: Path, cwd: Path | None = None, timeout: float = 240
) -> Iterator[str]:
    """``mlflow server`` on the store ``backend``, on a free port: its http:// address once
    ``/health`` answers. Its workers are in its process group, stopped with it at the end."""
    port = free_port()
    where = ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    with log.open("w") as out:
        server = subprocess.Popen(
            [MLFLOW, "server", "--backend-store-uri", backend, *options, *where],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
            start_new_session=True,
        )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


SLURM_CONFIGS = tuple(Path("/etc/slurm") / f for f in ("slurm.conf", "gres.conf", "slurmdbd.conf"))
SLURM_MARKER = "# written by start-slurm.sh"


def running(name: str) -> bool:
    """Whether a process whose command name is ``name`` runs on this machine."""
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == name:
                return True
        except OSError:  # it ended while we looked
            pass
    return False


def remove_stale_slurm_configs(configs: tuple[Path, ...] = SLURM_CONFIGS) -> list[Path]:
    """Remove the SLURM configuration that tests/slurm/start-slurm.sh wrote (its first line
    says so) when no controller runs: what a test run killed mid-way (a CI stopped with its
    machine) leaves behind. Snakemake imports snakemake-executor-plugin-slurm at every start,
    which asks ``scontrol`` for MinJobAge; with a slurm.conf naming a controller that is down,
    that waits about 9 s, in every Snakemake run of the suite: a CI run that found one took 44
    minutes, one without 26 (docs/tests.md). Another configuration, or one whose controller
    runs, is left alone.
    Returns what it removed."""
    if running("slurmctld"):
        return []
    removed = []
    for conf in configs:
        try:
            with conf.open() as f:
                ours = f.readline().startswith(SLURM_MARKER)
            if ours:
                conf.unlink()
                removed.append(conf)
        except OSError:  # absent, or not ours to read or remove (not root)
            pass
    return removed
