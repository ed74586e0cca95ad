"""Shared test setup: no network, no telemetry, one thread, a temporary tracking store."""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.pop("MLFLOW_RUN_ID", None)

from collections.abc import Iterator

import pytest
import torch

from localhttp import Server
from services import remove_stale_slurm_configs

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path, monkeypatch):
    """Every test logs to its own sqlite store, never the project's."""
    monkeypatch.setenv("GRADINV_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    torch.manual_seed(0)


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:
    """A local HTTP server for the download tests, serving ``tmp_path/www``."""
    (tmp_path / "www").mkdir()
    s = Server(tmp_path / "www")
    yield s
    s.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of end-to-end runs first, the one with the most of them at the head, so that
    under ``make test`` (files shared between two workers in this order:
    ``--no-loadscope-reorder``) the many short files fill both workers' last minutes. In
    pytest-xdist's own order, the files with the fewest tests first, these few-test files of
    5-18 minutes each came last, and one worker ran alone while the other had finished."""
    slow: dict[object, int] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            slow[item.path] = slow.get(item.path, 0) + 1
    items.sort(key=lambda item: -slow.get(item.path, 0))  # stable: a file's own order stays


def pytest_configure(config: pytest.Config) -> None:
    """Before any test, in the controller process: the SLURM configuration a killed test run
    left behind is removed (services.remove_stale_slurm_configs says why it matters)."""
    if not hasattr(config, "workerinput"):
        remove_stale_slurm_configs()
