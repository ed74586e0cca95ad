"""A job's start-up: every job is a process that imports torch before it does any work, and at
the default scale most jobs work for seconds, so what else a job imports is paid hundreds of
times over (``benchmarks/startup.py`` measures the share). The libraries below cost a job 1 to 5
seconds each on a 2-core machine and belong to the reports and to MLflow, not to the jobs."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# matplotlib and seaborn draw the reports' figures, pandas holds their tables, and mlflow is
# imported once per workflow, when the deferred runs are logged (tracking.defer)
REPORT_ONLY = ("matplotlib", "seaborn", "pandas", "mlflow")

SCRIPT = f"""
import os, sys
sys.path.insert(0, {str(TESTS)!r})
from pathlib import Path
from stages import Stages

root = Path(sys.argv[1])
os.environ.update(GRADINV_PROJECT_ROOT=str(root), GRADINV_TRACKING_ENABLED="true",
                  GRADINV_TRACKING_DEFER="true", GRADINV_TRACKING_EXPERIMENT="startup")
jobs = Stages(root)
for job in (jobs.prepare, jobs.partition_data, jobs.train, jobs.floor_image, jobs.select_victim,
            jobs.capture_update, jobs.run_attack, jobs.score):
    assert job() == 0, job.__name__
    print("after", job.__name__, *sorted(m for m in {REPORT_ONLY!r} if m in sys.modules), flush=True)
"""


def test_the_jobs_of_a_cell_import_nothing_of_the_reports_or_mlflow(tmp_path):
    """From data preparation to scoring, each job run to its end with deferred tracking (the
    default): a training job's run logged beside the store, not through MLflow; a job that
    reads a training summary does it without the report's tables and figures."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("after ")]
    assert [job for job, *_ in lines] == [
        "prepare",
        "partition_data",
        "train",
        "floor_image",
        "select_victim",
        "capture_update",
        "run_attack",
        "score",
    ]
    assert [line for line in lines if line[1:]] == []  # each job, and what it loaded
    assert list(tmp_path.glob("mlflow.db.pending/*")), "the training and scoring runs are pending"


def test_the_start_up_benchmark_alternates_the_two_commits_processes(tmp_path):
    """benchmarks/startup.py times each commit's processes in alternation, the order swapped
    every repeat: measured one commit after the other, a drift of the machine (its caches,
    another load) would pass for a difference between the commits."""
    sys.path.insert(0, str(TESTS.parent / "benchmarks"))
    try:
        startup = importlib.import_module("startup")
    finally:
        sys.path.remove(str(TESTS.parent / "benchmarks"))
    log = tmp_path / "order.txt"
    srcs = {}
    for side in ("before", "after"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "probe.py").write_text(
            f"with open({str(log)!r}, 'a') as f:\n    f.write({side[0]!r})\n"
        )
        srcs[side] = tmp_path / side
    seconds = startup.startup_seconds("probe", 4, srcs)
    assert log.read_text() == "baab" * 2
    assert set(seconds) == {"before", "after"} and all(s > 0 for s in seconds.values())


def test_building_an_optimizer_loads_the_compiler_and_the_benchmark_says_so():
    """benchmarks/optimizer_import.py: what a training or attack job pays for building SGD or
    Adam past importing torch (torch.optim imports torch._dynamo), and what it pays after
    eager_optimizers(). If a torch release stops importing it, or eager_optimizers() stops
    avoiding it, this fails, and docs/costs.md's figures are out of date."""
    script = TESTS.parent / "benchmarks" / "optimizer_import.py"
    out = subprocess.run(
        [sys.executable, str(script), "--repeats", "1"], capture_output=True, text=True, check=True
    ).stdout
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()[2:]]
    loaded = {(r[0], r[1]): r[3] for r in rows if r[2] == "loaded torch._dynamo"}
    assert loaded == {
        ("SGD", "torch as installed"): "1 of 1",
        ("SGD", "after eager_optimizers()"): "0 of 1",
        ("Adam", "torch as installed"): "1 of 1",
        ("Adam", "after eager_optimizers()"): "0 of 1",
    }
    timed = [float(r[3]) for r in rows if r[2] != "loaded torch._dynamo"]
    assert len(timed) == 16 and all(t >= 0 for t in timed)


EAGER = """
import copy, json, sys
import torch
if sys.argv[1] == "eager":
    from gradinv.stages.common import setup
    setup({})
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
data, target = torch.randn(16, 8), torch.randn(16, 2)
out = {}
for name, make in (
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4)),
    ("adam", lambda p: torch.optim.Adam(p, lr=0.01)),
    ("lbfgs", lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=5)),
):
    net = copy.deepcopy(model)
    optimizer = make(net.parameters())
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[3], gamma=0.1)

    def loss():
        optimizer.zero_grad()
        value = ((net(data) - target) ** 2).mean()
        value.backward()
        return value

    for _ in range(6):
        optimizer.step(loss)
        schedule.step()
    optimizer.load_state_dict(optimizer.state_dict())
    out[name] = [p.detach().flatten().tolist() for p in net.parameters()]
out["grad enabled"] = torch.is_grad_enabled()
out["dynamo"] = "torch._dynamo" in sys.modules
print(json.dumps(out))
"""


def test_eager_optimizers_compute_what_torch_computes_without_loading_the_compiler():
    """gradinv.stages.common.eager_optimizers (every stage's setup()): SGD with momentum, Adam and
    L-BFGS under a learning-rate schedule end with the same parameters, bit for bit, as under
    torch.optim as installed, and the compiler's front end (about 2 s a job) is not loaded."""
    runs = {}
    for way in ("torch", "eager"):
        out = subprocess.run(
            [sys.executable, "-c", EAGER, way], capture_output=True, text=True, check=True
        ).stdout
        runs[way] = json.loads(out)
    assert runs["torch"].pop("dynamo") is True and runs["eager"].pop("dynamo") is False
    assert runs["eager"] == runs["torch"] and runs["eager"]["grad enabled"] is True
