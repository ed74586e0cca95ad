"""Shared test setup: no network, no telemetry, one thread, a temporary tracking store."""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.pop("MLFLOW_RUN_ID", None)

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_tracking(tmp_path, monkeypatch):
    """Every test logs to its own sqlite store, never the project's."""
    monkeypatch.setenv("GRADINV_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    torch.manual_seed(0)
