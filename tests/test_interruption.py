"""Interruption: a killed run loses no finished work, leaves nothing half-written, and resumes.

Long jobs save progress at an undeclared path and resume from it with the same result as an
uninterrupted run; a killed Snakemake (SIGINT or SIGKILL) is rerun with the same command.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gradinv.attacks import ThreatModel, build_attack
from gradinv.defenses import build_defense
from gradinv.fl.client import client_update
from gradinv.fl.server import FLSettings, train
from gradinv.io import load_tensors, save_tensors
from gradinv.models import build_model
from gradinv.pipeline import finished_outputs
from gradinv.progress import Progress
from gradinv.protocol import ModelSpec, PublicMeta, ServerMessage, SharedUpdate
from interrupt import Interrupted, StopAfter
from test_workflow import SNAKEMAKE, run_folder, run_target, workflow_copy

MICRO = "tests/configs/micro.yaml"


# CVB's and DCS²'s way of training: FedAvg, a pass over the shard, Adam or momentum kept between
# a client's rounds, a decaying local rate
RECIPES = {
    "fedsgd": {},
    "fedavg-adam": dict(
        protocol="fedavg", client_optimizer="adam", local_lr=1e-3, local_epochs=1, lr_decay=0.99
    ),
    "fedavg-momentum": dict(protocol="fedavg", momentum=0.9, local_lr=0.01, local_epochs=1),
}


def _fl_case(recipe="fedsgd"):
    spec = ModelSpec("cnn3", num_classes=4, in_channels=3, image_size=16, settings={})
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 3, 16, 16, generator=g), torch.randint(0, 4, (64,), generator=g)
    parts = [list(range(i, 64, 4)) for i in range(4)]
    fl = FLSettings.from_dict(
        dict(
            protocol="fedsgd",
            rounds=6,
            clients_per_round=2,
            batch_size=8,
            lr=0.05,
            local_steps=1,
            local_lr=0.0,
            eval_every=1,
            checkpoint_rounds=[0, 3, 6],
            eval_samples=16,
        )
        | RECIPES[recipe]
    )
    defense = build_defense("gaussian_noise", {"std": 0.01}, where="test")  # uses the generator
    return spec, x, y, parts, fl, defense


def _train(progress, recipe="fedsgd"):
    spec, x, y, parts, fl, defense = _fl_case(recipe)
    model = build_model(spec, seed=0)
    checkpoints = {}

    def keep(rnd, m):
        checkpoints[rnd] = {k: v.clone() for k, v in m.state_dict().items()}

    history = train(model, x, y, parts, x[:16], y[:16], defense, fl, 7, keep, progress)
    return checkpoints, history


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_training_resumes_to_the_same_checkpoints_and_history(tmp_path, recipe):
    expected, expected_history = _train(None, recipe)
    with pytest.raises(Interrupted):
        _train(StopAfter(tmp_path / "p", saves=4), recipe)  # killed after round 4
    resumed = Progress(tmp_path / "p", fingerprint="f", every=0)
    checkpoints, history = _train(resumed, recipe)  # the clients' optimizers come back too
    assert history == expected_history
    assert sorted(checkpoints) == [0, 3, 6]  # the deleted outputs of rounds 0 and 3 come back
    for rnd in expected:
        for k in expected[rnd]:
            assert torch.equal(checkpoints[rnd][k], expected[rnd][k]), (rnd, k)


def test_progress_from_other_settings_is_ignored(tmp_path):
    with pytest.raises(Interrupted):
        _train(StopAfter(tmp_path / "p", saves=2))
    assert Progress(tmp_path / "p", fingerprint="other settings", every=0).load() is None
    assert Progress(tmp_path / "p", fingerprint="f", every=0).load()["round"] == 2


def test_a_finished_job_leaves_no_empty_progress_folders(tmp_path):
    root = tmp_path / "results" / ".progress"
    done = Progress(root / "utility" / "cnn3" / "noise" / "summary.json", "f", every=0)
    running = Progress(root / "utility" / "cnn3" / "censor" / "summary.json", "f", every=0)
    alone = Progress(root / "attacks" / "lenet" / "victim0.pt", "f", every=0)
    for progress in (done, running, alone):
        progress.save({"round": 1})
    done.finish()
    alone.finish()
    assert not (root / "utility" / "cnn3" / "noise").exists()
    assert running.load() == {"round": 1}  # a folder another job still uses is kept
    assert not (root / "attacks").exists()
    assert root.is_dir()  # the root stays


def _attack_case():
    spec = ModelSpec("cnn3", num_classes=4, in_channels=3, image_size=16, settings={})
    model = build_model(spec, seed=0)
    images = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    labels = torch.tensor([2])
    none = build_defense("none", {}, where="test")
    grads, *_ = client_update(
        model,
        images,
        labels,
        none,
        protocol="fedsgd",
        local_steps=1,
        local_lr=0.0,
        generator=torch.Generator(),
    )
    meta = PublicMeta(
        dataset="t",
        batch_size=1,
        image_shape=(3, 16, 16),
        num_classes=4,
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        model_mode="eval",
        defense="none",
        defense_kind="none",
        defense_settings={},
        local_steps=1,
        local_lr=0.0,
        labels=None,
    )
    server = ServerMessage(model=spec, state=model.state_dict(), round=0)
    return server, SharedUpdate(tensors=grads, kind="gradient", meta=meta)


def _attack(progress):
    server, update = _attack_case()
    settings = {"iterations": 40, "restarts": 3, "log_every": 5, "lr": 0.1}
    attack = build_attack("inverting_gradients", settings, ThreatModel(), where="test")
    return attack.reconstruct(server, update, torch.Generator().manual_seed(5), progress=progress)


# After the first step, midway (the restarts run together) and after the last step.
@pytest.mark.parametrize("saves", [1, 20, 40])
def test_attack_resumes_to_the_same_reconstruction(tmp_path, saves):
    expected = _attack(None)
    with pytest.raises(Interrupted):
        _attack(StopAfter(tmp_path / "p", saves=saves))
    resumed = _attack(Progress(tmp_path / "p", fingerprint="f", every=0))
    assert torch.equal(resumed.images, expected.images)
    assert resumed.history == expected.history
    assert resumed.summary == expected.summary


def test_a_truncated_progress_file_is_ignored_not_trusted(tmp_path):
    folder = tmp_path / "p"
    save_tensors(folder / "state.pt", {"fingerprint": "f", "state": {"round": 3}})
    data = (folder / "state.pt").read_bytes()
    (folder / "state.pt").write_bytes(data[: len(data) // 2])
    assert Progress(folder, fingerprint="f", every=0).load() is None


# --- Killing Snakemake -------------------------------------------------------------------------


def _start(root: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}
    env.pop("GRADINV_TRACKING_URI", None)  # the workflow's own store, in its folder
    with log.open("w") as out:
        return subprocess.Popen(
            [*SNAKEMAKE, "results/table1.csv", "--cores", "2", "--configfile", MICRO],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, as a terminal or a batch system has
            preexec_fn=_ctrl_c_stops,
        )


def _ctrl_c_stops() -> None:
    """SIGINT as a terminal delivers it. A shell starts background commands with SIGINT ignored,
    and Python then never raises KeyboardInterrupt: a suite run as `make test &` would see
    Snakemake (and every job) ignore Ctrl-C and finish the table."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(proc: subprocess.Popen, log: Path) -> None:
    """Ctrl-C, pressed again until Snakemake takes it.

    Python can drop a KeyboardInterrupt: Snakemake's log handler ignores one that lands while it
    writes a line, and the SIGINT tends to arrive just as a job finishes and is logged. A user
    presses Ctrl-C again; Snakemake's answer, "Terminating processes on user request", or its
    exit, says it took it.
    """
    for _ in range(40):
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=0.5)
            return
        except subprocess.TimeoutExpired:
            if "on user request" in log.read_text():
                proc.wait(timeout=120)
                return
    raise AssertionError("Snakemake ignored 40 SIGINTs:\n" + log.read_text()[-3000:])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_killed_snakemake_resumes_without_recomputing_finished_jobs(tmp_path, sig):
    root = workflow_copy(tmp_path)
    run = run_folder(root, MICRO)
    log = tmp_path / "snakemake.log"
    proc = _start(root, log)
    deadline = time.monotonic() + 600
    attacks = run / "results" / "attacks"
    while not list(attacks.rglob("victim*.pt")):  # the first attack done, the others to come
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    if sig == signal.SIGINT:
        _interrupt(proc, log)
        assert "in __onerror" not in log.read_text()  # the Snakefile's handler ran to its end
    else:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)
        os.killpg(proc.pid, signal.SIGKILL) if _group_alive(proc.pid) else None
        assert any((run / ".snakemake" / "locks").glob("*.lock"))  # the killed run's lock
    time.sleep(0.5)
    before = finished_outputs(run)
    assert before and not (run / "results/table1.csv").exists(), log.read_text()[-3000:]

    run_target(root, "--cores", "2", "--configfile", MICRO)  # the same command again
    after = finished_outputs(run)
    recomputed = [p for p, mtime in before.items() if after.get(p) != mtime]
    assert recomputed == []  # finished jobs are kept as they were
    assert (run / "results/table1.csv").exists()
    leftovers = [p for p in (run / "results").rglob("*.tmp")]
    assert leftovers == []  # no temporary file survives the resumed run
    for path in (run / "results").rglob("*.pt"):
        if ".progress" not in path.parts:
            load_tensors(path)  # every tensor output is whole and verified
    assert not list((run / "results" / ".progress").rglob("*.pt"))  # finished jobs clean up


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
