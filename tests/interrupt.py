"""A Progress that 'kills' its job after a number of saves, for the resume tests."""

from __future__ import annotations

from pathlib import Path

from gradinv.progress import Progress


class Interrupted(Exception):
    """Stands for the job being killed."""


class StopAfter(Progress):
    """Saves the loop state after every step, and raises :class:`Interrupted` after ``saves``
    of them; the extra snapshots a loop keeps under other names (FL checkpoints) do not count."""

    def __init__(self, folder: Path, saves: int) -> None:
        super().__init__(folder, fingerprint="f", every=0)
        self.left = saves

    def save(self, state, name="state"):
        super().save(state, name)
        if name == "state":
            self.left -= 1
            if self.left == 0:
                raise Interrupted
