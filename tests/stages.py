"""Run the pipeline's stages in-process, as Snakemake's rules would, for the reliability tests."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradinv.cli import main
from gradinv.config import REPO_ROOT, load, validate
from gradinv.jobs import job_settings

MICRO = REPO_ROOT / "tests" / "configs" / "micro.yaml"


@contextlib.contextmanager
def in_project(root: Path) -> Iterator[None]:
    """Jobs run as if ``root`` were the project, MLflow off (for a module-scoped fixture, where
    pytest's monkeypatch is not available); the environment is restored after."""
    old = {k: os.environ.get(k) for k in ("GRADINV_PROJECT_ROOT", "GRADINV_TRACKING")}
    os.environ.update(GRADINV_PROJECT_ROOT=str(root), GRADINV_TRACKING="off")
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Stages:
    """The micro configuration's stages for one defense, writing under ``root``."""

    def __init__(self, root: Path, defense: str = "none", **changes: Any) -> None:
        config = copy.deepcopy(load(REPO_ROOT / "params.yaml", (MICRO,)))
        for dotted, value in changes.items():
            *parents, last = dotted.split("__")
            node = config
            for key in parents:
                node = node[key]
            node[last] = value
        self.config = validate(config)
        self.root, self.defense = root, defense
        rnd = self.config["capture"]["round"]
        self.w = dict(dataset="patches", model="cnn3", defense=defense, round=str(rnd), bs="1")
        run = f"patches/cnn3/{defense}/r{rnd}_b1"
        self.prepared = root / "data/prepared/patches.pt"
        self.partition = root / "data/partitions/patches.json"
        rounds = self.config["fl"]["checkpoint_rounds"]
        self.checkpoints = [
            root / f"results/checkpoints/patches/cnn3/{defense}/round{r}.pt" for r in rounds
        ]
        self.captured_checkpoint = self.checkpoints[rounds.index(rnd)]
        self.summary = root / f"results/train/patches/cnn3/{defense}/summary.json"
        self.victim = root / "results/victims/patches/b1/victim0.pt"
        self.capture = root / f"results/captures/{run}/victims0-0.pt"  # a job of one victim
        self.attack = root / f"results/attacks/{run}/ig/victims0-0.pt"  # a job of one victim
        self.scores = root / f"results/metrics/{run}/ig/v1.json"  # the cell's one victim
        self.floor = root / "data/floor/patches.pt"

    def settings(self, stage: str, **w: str) -> str:
        return job_settings(self.config, stage, **{**self.w, **w})

    def prepare(self) -> int:
        return main(
            [
                "prepare",
                "--settings",
                self.settings("prepare"),
                "--raw-dir",
                str(self.root / "raw"),
                "--out",
                str(self.prepared),
            ]
        )

    def partition_data(self) -> int:
        return main(
            [
                "partition",
                "--settings",
                self.settings("partition"),
                "--dataset",
                "patches",
                "--prepared-dir",
                str(self.prepared.parent),
                "--out",
                str(self.partition),
            ]
        )

    def train(self) -> int:
        return main(
            [
                "train",
                "--settings",
                self.settings("train"),
                "--prepared-dir",
                str(self.prepared.parent),
                "--partition",
                str(self.partition),
                "--checkpoints",
                *map(str, self.checkpoints),
                "--summary",
                str(self.summary),
            ]
        )

    def floor_image(self) -> int:
        return main(
            [
                "floor",
                "--settings",
                self.settings("floor"),
                "--prepared-dir",
                str(self.prepared.parent),
                "--partition",
                str(self.partition),
                "--out",
                str(self.floor),
            ]
        )

    def select_victim(self) -> int:
        return main(
            [
                "victim",
                "--dataset",
                "patches",
                "--prepared-dir",
                str(self.prepared.parent),
                "--victim",
                "0",
                "--batch-size",
                "1",
                "--stride",
                "37",
                "--out",
                str(self.victim),
            ]
        )

    def capture_update(self) -> int:
        return main(
            [
                "capture",
                "--settings",
                self.settings("capture"),
                "--checkpoint",
                str(self.captured_checkpoint),
                "--victim-files",
                str(self.victim),
                "--out",
                str(self.capture),
            ]
        )

    def run_attack(self) -> int:
        return main(
            [
                "attack",
                "--settings",
                self.settings("attack", attack="ig"),
                "--capture",
                str(self.capture),
                "--out",
                str(self.attack),
            ]
        )

    def score(self) -> int:
        return main(
            [
                "score",
                "--settings",
                self.settings("score", attack="ig"),
                "--reconstructions",
                str(self.attack),
                "--victim-files",
                str(self.victim),
                "--capture",
                str(self.capture),
                "--floor",
                str(self.floor),
                "--out",
                str(self.scores),
                "--model",
                "cnn3",
                "--round",
                self.w["round"],
            ]
        )

    @property
    def metrics(self) -> dict:
        """Victim 0's record in the cell's score file."""
        from gradinv.tables.files import read_records

        return read_records(self.scores)[0]

    def all(self) -> None:
        for step in (
            self.prepare,
            self.partition_data,
            self.floor_image,
            self.train,
            self.select_victim,
            self.capture_update,
            self.run_attack,
            self.score,
        ):
            assert step() == 0, step.__name__
