"""The code's style, checked where CI sees it: `ruff check` (the rules in pyproject.toml) and
`ruff format --check` over the whole tree. Before this test, a format slip in tests/ passed CI
and was found by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")  # the dev extra installs it beside the interpreter


@pytest.mark.parametrize(
    "args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"]
)
def test_the_tree_passes_ruff(args):
    assert RUFF.exists(), f"{RUFF} is missing: `make env` installs the dev extra with ruff"
    run = subprocess.run(
        [str(RUFF), *args, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, f"`ruff {' '.join(args)}` finds:\n{run.stdout}{run.stderr}"
