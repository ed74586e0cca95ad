"""A capture job and an attack job each take several victims of a cell (params.yaml
``victims_per_job``): a victim's capture and result must not depend on how the victims are
grouped, a victim attacked before an interruption is not attacked again, and the score stage finds
each victim in the files that hold it."""

import json

import pytest
import torch

from gradinv.io import load_tensors, save_tensors
from gradinv.jobs import victim_groups
from gradinv.stages import attack as attack_stage
from gradinv.stages import capture as capture_stage
from gradinv.stages.common import victim_runs
from stages import Stages, in_project


def test_victim_groups_cover_the_first_n_victims_in_runs_of_per_job():
    assert victim_groups(16, 4) == [(0, 3), (4, 7), (8, 11), (12, 15)]
    assert victim_groups(6, 4) == [(0, 3), (4, 5)]  # the last run shorter
    assert victim_groups(3, 1) == [(0, 0), (1, 1), (2, 2)]
    assert victim_groups(2, 8) == [(0, 1)]
    assert victim_groups(0, 4) == []
    with pytest.raises(ValueError, match="per_job >= 1"):
        victim_groups(4, 0)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """One victim's capture (prepare .. capture), and the attack job's settings."""
    root = tmp_path_factory.mktemp("chain")
    stages = Stages(root)
    with in_project(root):
        for step in (
            stages.prepare,
            stages.partition_data,
            stages.train,
            stages.select_victim,
            stages.capture_update,
        ):
            assert step() == 0, step.__name__
    return stages


@pytest.fixture
def project(chain, monkeypatch):
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(chain.root))
    monkeypatch.setenv("GRADINV_TRACKING", "off")
    settings = json.loads(chain.settings("attack", attack="ig"))
    settings["attack"]["iterations"] = 40  # a few steps show whether two runs agree
    return chain, settings


def captures_of(chain, victims, name):
    """A capture job's file of ``victims``, each with victim 0's update (a job's file of one
    victim, made by the capture stage, copied): only their seeds tell them apart."""
    one = load_tensors(chain.capture)
    path = chain.capture.parent / name
    save_tensors(
        path, {"victims": victims, "server": one["server"], "runs": one["runs"] * len(victims)}
    )
    return path


def test_a_victims_capture_is_the_same_alone_or_in_a_group(project):
    chain, _ = project
    settings = json.loads(chain.settings("capture"))
    folder = chain.capture.parent
    victim = chain.victim  # the same private batch as victims 0 and 1
    capture_stage.run(settings, chain.captured_checkpoint, [victim, victim], folder / "g0-1.pt")
    capture_stage.run(settings, chain.captured_checkpoint, [victim], folder / "g1-1.pt", first=1)
    group, alone = load_tensors(folder / "g0-1.pt"), load_tensors(folder / "g1-1.pt")
    assert group["victims"] == [0, 1] and alone["victims"] == [1]
    assert group["server"]["round"] == alone["server"]["round"]
    update = group["runs"][1]["update"]["tensors"]
    for name, tensor in update.items():
        assert torch.equal(tensor, alone["runs"][0]["update"]["tensors"][name]), name


def test_a_victims_result_is_the_same_alone_or_in_a_group(project):
    chain, settings = project
    folder = chain.attack.parent
    attack_stage.run(settings, captures_of(chain, [0, 1], "c0-1.pt"), folder / "victims0-1.pt")
    attack_stage.run(settings, captures_of(chain, [0], "c0-0.pt"), folder / "victims0-0.pt")
    attack_stage.run(settings, captures_of(chain, [1], "c1-1.pt"), folder / "victims1-1.pt")
    group = load_tensors(folder / "victims0-1.pt")
    assert group["victims"] == [0, 1]
    alone = [load_tensors(folder / f"victims{v}-{v}.pt")["runs"][0] for v in (0, 1)]
    for grouped, single in zip(group["runs"], alone, strict=True):
        assert grouped["status"] == single["status"] == "ok"
        assert torch.equal(grouped["images"], single["images"])
    # victim 1's seed is its own: the same update gives another reconstruction
    assert not torch.equal(group["runs"][0]["images"], group["runs"][1]["images"])
    left = [p for p in (chain.root / "results/.progress").rglob("*") if p.is_file()]
    assert left == []  # finished: no progress left behind


def test_a_victim_finished_before_an_interruption_is_not_attacked_again(project, monkeypatch):
    chain, settings = project
    out = chain.attack.parent / "victims0-2.pt"
    captures = captures_of(chain, [0, 1, 2], "c0-2.pt")
    real, attacked = attack_stage.attack_one, []

    def interrupted(settings, data, own, inputs, generator=None):
        if own.name == "victim2.pt":
            raise KeyboardInterrupt  # the job is killed while it attacks victim 2
        attacked.append(own.name)
        return real(settings, data, own, inputs, generator)

    monkeypatch.setattr(attack_stage, "attack_one", interrupted)
    with pytest.raises(KeyboardInterrupt):
        attack_stage.run(settings, captures, out)
    assert attacked == ["victim0.pt", "victim1.pt"] and not out.exists()

    attacked.clear()

    def counted(*args, **kwargs):
        attacked.append(args[2].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(attack_stage, "attack_one", counted)
    attack_stage.run(settings, captures, out)
    assert attacked == ["victim2.pt"]  # victims 0 and 1 came from the saved progress
    resumed = load_tensors(out)
    attack_stage.run(settings, captures, chain.attack.parent / "fresh0-2.pt")
    fresh = load_tensors(chain.attack.parent / "fresh0-2.pt")
    assert resumed["victims"] == [0, 1, 2]
    for a, b in zip(resumed["runs"], fresh["runs"], strict=True):
        assert torch.equal(a["images"], b["images"])


def test_the_score_stage_reads_each_victim_from_the_file_that_holds_it(tmp_path):
    first, second = tmp_path / "victims0-1.pt", tmp_path / "victims2-3.pt"
    server = {"round": 0}
    runs = [{"seconds": 0.0}, {"status": "failed", "failure": "x"}]
    save_tensors(first, {"victims": [0, 1], "server": server, "runs": runs})
    save_tensors(second, {"victims": [2, 3], "runs": [{"seconds": 2.0}, {"seconds": 3.0}]})
    found = victim_runs([first, second], 3)  # a table of 3 victims reads 2 files
    assert [(path.name, index) for path, index, _ in found] == [
        ("victims0-1.pt", 0),
        ("victims0-1.pt", 1),
        ("victims2-3.pt", 0),
    ]
    # a capture's run comes with the server message its file holds once (not a failed one)
    assert [run for _, _, run in found] == [
        {"seconds": 0.0, "server": server},
        {"status": "failed", "failure": "x"},
        {"seconds": 2.0},
    ]
    with pytest.raises(ValueError, match="holds victim 2 where victim 0 was expected"):
        victim_runs([second, first], 4)
    with pytest.raises(ValueError, match="5 victims asked for, 4 found"):
        victim_runs([first, second], 5)
