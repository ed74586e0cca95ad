"""Resumable progress for long jobs (FL training, attacks with many iterations).

Snakemake deletes a job's declared outputs before it reruns the job, so a long job keeps its
progress at an *undeclared* path: ``results/.progress/<output path>/``. Every
``GRADINV_PROGRESS_EVERY`` seconds (params.yaml ``progress.every_seconds``; 0 = after every step)
the job saves everything its loop needs to continue (model or image tensors, optimiser and
scheduler state, random-generator states, history) atomically. Run again after an interruption,
the job resumes from that state and produces the same result, bit for bit on CPU, as an
uninterrupted run with the same seed. The saved state is tagged with a fingerprint of the job's
settings and inputs; state from other settings or inputs is ignored (and said so in the log).
The folder, and the folders above it left empty, are removed when the job finishes.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gradinv.io import CorruptFileError, load_tensors, save_tensors

ENV_EVERY = "GRADINV_PROGRESS_EVERY"
DEFAULT_EVERY = 300.0


class Progress:
    """The saved state of one job, at ``folder``; ``fingerprint`` ties it to settings and inputs.

    ``every`` is the save interval in seconds (None: read ``GRADINV_PROGRESS_EVERY``); a negative
    value disables saving (and resuming).
    """

    def __init__(self, folder: Path, fingerprint: str, every: float | None = None) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.every = float(os.environ.get(ENV_EVERY, DEFAULT_EVERY)) if every is None else every
        self._last = time.monotonic()

    @classmethod
    def for_output(cls, output: Path, fingerprint: str, every: float | None = None) -> Progress:
        """The progress folder of the job that writes ``output`` (a path in the run's folder)."""
        from gradinv.config import run_root

        root = run_root()
        output = Path(output).resolve()
        try:
            rel = output.relative_to(root / "results")
        except ValueError:
            rel = Path(*output.parts[1:])  # outside results/: mirror the absolute path
        return cls(root / "results" / ".progress" / rel, fingerprint, every)

    @property
    def enabled(self) -> bool:
        return self.every >= 0

    def load(self, name: str = "state") -> dict[str, Any] | None:
        """The saved state ``name``, or None (nothing saved, other settings, or unreadable)."""
        path = self.folder / f"{name}.pt"
        if not self.enabled or not path.exists():
            return None
        try:
            saved = load_tensors(path)
        except CorruptFileError as err:
            _say(f"ignoring unreadable progress {path}: {err}")
            return None
        if saved.get("fingerprint") != self.fingerprint:
            _say(f"ignoring progress {path}: it was saved for other settings or inputs")
            return None
        return saved["state"]

    def due(self) -> bool:
        """True when ``every`` seconds have passed since the last save (or the start)."""
        return self.enabled and time.monotonic() - self._last >= self.every

    def save(self, state: dict[str, Any], name: str = "state") -> None:
        if not self.enabled:
            return
        save_tensors(self.folder / f"{name}.pt", {"fingerprint": self.fingerprint, "state": state})
        self._last = time.monotonic()

    def resumed(self, what: str) -> None:
        _say(f"resuming from saved progress ({what}) in {self.folder}")

    def finish(self) -> None:
        """The job's outputs are written: its progress is no longer needed, nor the folders
        above it that held nothing else (up to ``results/.progress`` itself)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        if ".progress" not in self.folder.parts:
            return  # a folder of the caller's choosing: its parents are not ours
        for parent in self.folder.parents:
            if parent.name == ".progress":
                break
            try:
                parent.rmdir()  # only an empty folder; another job's progress keeps its own
            except OSError:
                break


def _say(message: str) -> None:
    print(f"gradinv: {message}", file=sys.stderr, flush=True)
