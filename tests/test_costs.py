"""benchmarks/costs.py and the modules beside it (jobs.py, default_scale.py, full_scale.py):
Snakemake's dry run read into (rule, output) jobs; a job several targets need counted in each and
once in ``all``; a job without a measurement estimated from the median of measured jobs of its
kind, or reported as unmeasured, never as 0 s; full-scale seconds as iterations x the measured
seconds of one iteration; a CPU figure never labelled as a GPU's."""

import base64
import importlib
import json
import os
import sys
from datetime import datetime
from pathlib import Path

import pytest

from gradinv.config import load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import the modules beside them by name
costs, default_scale, full_scale, jobs = (
    importlib.import_module(name) for name in ("costs", "default_scale", "full_scale", "jobs")
)

BLOCK = """[Tue Nov 24 10:17:42 2026]
rule {rule}:
{fields}    jobid: {jobid}
    reason: Forced execution
    resources: tmpdir=/tmp
"""


def dry_run_text(jobs):
    """What ``snakemake -n`` prints for ``jobs``: (jobid, rule, {field: value})."""
    counts = {}
    for _, rule, _ in jobs:
        counts[rule] = counts.get(rule, 0) + 1
    stats = "Job stats:\njob      count\n-----  -------\n"
    stats += "".join(f"{r}  {n}\n" for r, n in counts.items()) + f"total  {len(jobs)}\n\n"
    blocks = "".join(
        BLOCK.format(
            rule=rule, jobid=jobid, fields="".join(f"    {k}: {v}\n" for k, v in fields.items())
        )
        for jobid, rule, fields in jobs
    )
    return "Building DAG of jobs...\n" + stats + blocks + stats + "This was a dry-run (flag -n)."


# prepare feeds two trainings; table a needs training x, table b both; claims reads both tables
SHARED = [
    (3, "prepare", {"output": "data/p.pt", "wildcards": "dataset=patches"}),
    (
        4,
        "train",
        {
            "input": "data/p.pt",
            "output": "ck/x.pt",
            "benchmark": "results/benchmarks/train/x.tsv",
            "wildcards": "dataset=patches, model=cnn3, defense=x",
        },
    ),
    (
        5,
        "train",
        {
            "input": "data/p.pt",
            "output": "ck/y.pt",
            "benchmark": "results/benchmarks/train/y.tsv",
            "wildcards": "dataset=patches, model=cnn3, defense=y",
        },
    ),
    (1, "report", {"input": "ck/x.pt", "output": "results/a.csv, results/a.md"}),
    (2, "report", {"input": "ck/x.pt, ck/y.pt", "output": "results/b.csv"}),
    (6, "claims", {"input": "results/a.csv, results/b.csv", "output": "results/claims.md"}),
    (0, "all", {"input": "results/a.csv, results/b.csv, results/claims.md"}),
]


def write_tsv(root, path, seconds):
    path = root / path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:10\t100.0\n")


@pytest.fixture(scope="module")
def utility_dry_run():
    """A real dry run of a small target, with the tests' micro overlay."""
    text = jobs.dry_run(["tests/configs/micro.yaml"], target="results/utility.csv")
    return text, load(ROOT / "params.yaml", (ROOT / "tests/configs/micro.yaml",))


@pytest.fixture(scope="module")
def paper_config():
    return load(ROOT / "params.yaml", (ROOT / "workflow/configs/paper.yaml",))


def test_a_real_dry_run_is_read_into_rules_outputs_and_wildcards(utility_dry_run):
    text, config = utility_dry_run
    dag = jobs.Dag(jobs.parse_dry_run(text))
    report = dag.producer["results/utility.csv"]
    assert report.rule == "report_utility"
    assert dag.root() is report and dag.targets() == ["results/utility.csv"]
    trains = [j for j in dag.jobs if j.rule == "train_utility"]
    study = config["utility"]
    runs = sorted((j.w["defense"], int(j.w["seed"])) for j in trains)
    assert runs == sorted((d, s) for d in study["defenses"] for s in study["seeds"])
    for job in trains:
        assert job.w["model"] == study["model"] and job.w["dataset"] == study["dataset"]
        run = f"{study['dataset']}/{study['model']}/{job.w['defense']}/seed{job.w['seed']}"
        assert job.output == (
            f"results/utility/common/{run}/final.pt",
            f"results/utility/common/{run}/summary.json",
        )
        assert job.benchmark.startswith("results/benchmarks/utility/")
        assert dag.producer[f"data/prepared/{study['dataset']}.pt"].jobid in dag.needs(
            job.output[1]
        )
    assert set(report.input) == {j.output[1] for j in trains}
    assert dag.needs("results/utility.csv") == {j.jobid for j in dag.jobs}


def test_jobs_inside_a_group_are_read_like_the_others():
    """A cell's captures and attacks run as one group (cluster.group_cells, the default), and a
    dry run prints them indented under the group's line."""
    text = jobs.dry_run(["tests/configs/micro.yaml"], target="results/table1.csv")
    assert "\n    rule attack:\n" in text  # grouped, as this test means
    dag = jobs.Dag(jobs.parse_dry_run(text))
    attacks = [j for j in dag.jobs if j.rule == "attack"]
    assert attacks and all(j.benchmark.startswith("results/benchmarks/attack/") for j in attacks)
    for job in attacks:
        capture = dag.producer[job.input[0]]
        assert capture.rule == "capture" and capture.w["defense"] == job.w["defense"]
        assert job.output[0].startswith("results/attacks/") and "attack" in job.w


def test_a_dry_run_that_loses_a_job_is_refused(utility_dry_run):
    text, _ = utility_dry_run
    block = text.index("rule train_utility:")
    broken = text[:block] + text[block:].replace("rule train_utility:", "rule:", 1)
    with pytest.raises(ValueError, match="Job stats"):
        jobs.parse_dry_run(broken)


def test_a_shared_job_counts_in_every_target_and_once_in_all(tmp_path):
    dag = jobs.Dag(jobs.parse_dry_run(dry_run_text(SHARED)))
    assert dag.targets() == ["results/a.csv", "results/b.csv", "results/claims.md"]
    write_tsv(tmp_path, "results/benchmarks/train/x.tsv", 100)
    write_tsv(tmp_path, "results/benchmarks/train/y.tsv", 10)
    per_target = jobs.target_jobs(dag)
    rules = {t: sorted(j.jobid for j in per_target[t][0]) for t in per_target}
    own = {t: sorted(j.jobid for j in per_target[t][1]) for t in per_target}
    assert rules == {
        "results/a.csv": [1, 3, 4],
        "results/b.csv": [2, 3, 4, 5],
        "results/claims.md": [1, 2, 3, 4, 5, 6],
        "all": [1, 2, 3, 4, 5, 6],  # `all` itself runs nothing
    }
    # x is b's too; claims.md, built on both tables, takes nothing from them
    assert own == {
        "results/a.csv": [1],
        "results/b.csv": [2, 5],
        "results/claims.md": [6],
        "all": [1, 2, 3, 4, 5, 6],
    }
    rows = costs.default_rows(dag, default_scale.default_costs(dag.jobs, tmp_path))
    assert rows["results/a.csv"]["default_measured_seconds"] == 100
    assert rows["results/b.csv"]["default_measured_seconds"] == 110
    assert rows["all"]["default_measured_seconds"] == 110  # x once, not once per table
    assert rows["results/b.csv"]["exclusive_seconds"] == 10


def attack_job(jobid, attack, victim, defense="none", model="cnn3"):
    run = f"patches/{model}/{defense}/r0_b1/{attack}/victims{victim}-{victim}"
    return jobs.Job(
        jobid=jobid,
        rule="attack",
        output=(f"results/attacks/{run}.pt",),
        benchmark=f"results/benchmarks/attack/{run}.tsv",
        wildcards=(
            ("dataset", "patches"),
            ("model", model),
            ("defense", defense),
            ("round", "0"),
            ("bs", "1"),
            ("attack", attack),
            ("first", str(victim)),
            ("last", str(victim)),
        ),
    )


def test_an_unmeasured_job_takes_the_median_of_its_kind_or_stays_unmeasured(tmp_path):
    attacks = [
        attack_job(1, "ig", 0),
        attack_job(2, "ig", 1),
        attack_job(3, "ig", 2),  # the same work on another victim
        attack_job(4, "ig", 0, defense="noise"),  # the same attack, another defense
        attack_job(5, "ig", 0, model="resnet18"),  # another model: no stand-in
        attack_job(6, "gi", 0),  # an attack never measured
    ]
    write_tsv(tmp_path, attacks[0].benchmark, 10)
    write_tsv(tmp_path, attacks[1].benchmark, 30)
    got = default_scale.default_costs(attacks, tmp_path)
    assert got[1] == default_scale.Cost(10, "measured", "benchmark file")
    assert got[2].seconds == 30 and got[2].kind == "measured"
    assert got[3].seconds == 20 and got[3].kind == "estimated"
    assert got[3].how == "median of 2 measured attack job(s) with the same settings"
    assert got[4].seconds == 20 and "the same attack" in got[4].how
    for jobid in (5, 6):
        assert got[jobid].seconds is None and got[jobid].kind is None


def test_a_rule_without_any_measurement_is_unmeasured_not_zero(tmp_path):
    dag = jobs.Dag(jobs.parse_dry_run(dry_run_text(SHARED)))
    write_tsv(tmp_path, "results/benchmarks/train/x.tsv", 50)
    rows = costs.default_rows(dag, default_scale.default_costs(dag.jobs, tmp_path))
    a = rows["results/a.csv"]  # report and prepare have no benchmark and no record here
    assert (a["measured_jobs"], a["estimated_jobs"], a["unmeasured_jobs"]) == (1, 0, 2)
    assert a["unmeasured_rules"] == "prepare 1, report 1"
    cell = costs.default_cell(a)
    assert cell == "≥ 50 s (1 measured); 2 unmeasured: prepare 1, report 1"
    assert a["default_seconds"] == 50  # the two unmeasured jobs add nothing, and say so
    nothing = costs.default_rows(dag, default_scale.default_costs(dag.jobs, tmp_path / "empty"))
    row = nothing["results/a.csv"]
    assert row["default_seconds"] is None
    assert costs.default_cell(row).startswith("unmeasured (3 jobs")
    assert "0 s" not in costs.default_cell(row)


def test_snakemake_records_time_a_job_only_when_its_output_is_that_runs(tmp_path):
    job = jobs.Job(jobid=1, rule="prepare_data", output=("data/prepared/patches.pt",))
    out = tmp_path / job.output[0]
    out.parent.mkdir(parents=True)
    metadata = tmp_path / ".snakemake" / "metadata"
    metadata.mkdir(parents=True)
    name = base64.urlsafe_b64encode(job.output[0].encode()).decode()
    record = {"rule": "prepare_data", "incomplete": False, "starttime": 1000.0, "endtime": 1012.5}
    (metadata / name).write_text(json.dumps(record))
    assert default_scale.record_seconds(job, tmp_path) is None  # killed: the output never came
    out.write_bytes(b"x")
    os.utime(out, (1012.5, 1012.5))
    assert default_scale.record_seconds(job, tmp_path) == pytest.approx(12.5)
    assert default_scale.own_measurement(job, tmp_path).how == "Snakemake's record of the run"
    os.utime(out, (2000.0, 2000.0))  # written since by something else
    assert default_scale.record_seconds(job, tmp_path) is None


def paper_job(config, rule, attack, dataset, victims=1):
    table = config["tables"]["table1"]
    model = table["model"] if isinstance(table["model"], str) else table["model"][0]
    wildcards = (
        ("dataset", dataset),
        ("model", model),
        ("defense", "none"),
        ("round", "0"),
        ("bs", "1"),
        ("attack", attack),
        *((("first", "0"), ("last", str(victims - 1))) if rule == "attack" else (("n", "1"),)),
    )
    return jobs.Job(jobid=1, rule=rule, output=("x.pt",), wildcards=wildcards)


def test_full_scale_seconds_are_iterations_times_the_measured_iteration(paper_config):
    job = paper_job(paper_config, "attack", "ig", "imagenet")
    plan = full_scale.job_plan(paper_config, job)
    ig = paper_config["attacks"]["ig"]
    ((count, key),) = plan.terms
    assert count == ig["iterations"] * ig["restarts"]
    unit = json.loads(key)
    assert (unit["kind"], unit["shape"], unit["batch"]) == ("attack_iteration", [3, 64, 64], 1)
    assert full_scale.plan_seconds(plan, {}) == (
        None,
        f"no per-iteration measurement of {key} (run --measure-iterations)",
    )
    assert full_scale.plan_seconds(plan, {key: {"seconds": 0.01}})[0] == pytest.approx(count * 0.01)
    three = full_scale.job_plan(
        paper_config, paper_job(paper_config, "attack", "ig", "imagenet", 3)
    )
    assert three.terms == ((3 * count, key),)  # a job of three victims: three attacks

    gifd = full_scale.job_plan(paper_config, paper_job(paper_config, "attack", "gifd", "imagenet"))
    (n_gen, gen), (n_step, step) = gifd.terms
    assert gifd.per_block == gen  # stages 0: one stage per block of the generator
    settings = paper_config["attacks"]["gifd"]
    steps = settings["restarts"] * settings["iterations"]
    assert n_gen == n_step == steps  # batch 1: one generator pass and one attack iteration each
    assert json.loads(gen)["kind"] == "generator_forward_backward"
    units = {gen: {"seconds": 2.0, "num_blocks": 13}, step: {"seconds": 0.5}}
    assert full_scale.plan_seconds(gifd, units)[0] == pytest.approx(13 * steps * (2.0 + 0.5))
    score = full_scale.job_plan(paper_config, paper_job(paper_config, "score", "ig", "imagenet"))
    assert full_scale.plan_seconds(score, units) == (None, "score: no per-iteration model")


def test_a_cpu_measurement_is_never_labelled_a_gpu_figure():
    cpu = {"device": "cpu", "device_name": "Some CPU", "threads": 2}
    label = costs.device_label(cpu)
    assert label.startswith("CPU") and "upper bound" in label and "GPU (" not in label
    row = {"target": "all", "jobs": 1, "exclusive_jobs": 1, "unmeasured_jobs": 1,
           "unmeasured_rules": "report 1", "default_seconds": None, "full_jobs": 1,
           "full_unestimated_jobs": 0, "full_seconds": 10.0, "full_estimated_jobs": 1,
           "full_leaves_out": ""}  # fmt: skip
    meta = {"default_config": "params.yaml", "measured_in": ".", "paper_config": "paper",
            "device": label, "iterations_device": "cpu", "written": "now"}  # fmt: skip
    md = costs.markdown([row], meta)
    assert "from CPU per-iteration costs (an upper bound for one GPU)" in md
    assert "full scale, one GPU" not in md
    gpu = costs.device_label({"device": "cuda", "device_name": "NVIDIA H100"})
    assert gpu == "GPU (NVIDIA H100)"


def utility_job(jobid, defense, model="cnn3", recipe="common", seed=0):
    run = f"{recipe}/patches/{model}/{defense}/seed{seed}"
    return jobs.Job(
        jobid=jobid,
        rule="train_utility",
        output=(f"results/utility/{run}/summary.json",),
        benchmark=f"results/benchmarks/utility/{run}.tsv",
        wildcards=(
            ("recipe", recipe),
            ("dataset", "patches"),
            ("model", model),
            ("defense", defense),
            ("seed", str(seed)),
        ),
    )


def test_an_unrun_seed_takes_its_own_recipes_median_never_another_recipes(tmp_path):
    runs = [
        utility_job(1, "noise", recipe="cvb", seed=0),
        utility_job(2, "noise", recipe="cvb", seed=1),
        utility_job(3, "noise", recipe="common", seed=0),  # the same defense, a shorter recipe
        utility_job(4, "noise", recipe="cvb", seed=2),  # another seed of a measured kind
        utility_job(5, "noise-std0.1", recipe="cvb"),  # a sweep's variant: its base, this recipe
        utility_job(6, "noise", recipe="dcs2", seed=0),  # a recipe never measured: no stand-in
    ]
    for job, seconds in zip(runs[:3], (400, 500, 100), strict=True):
        write_tsv(tmp_path, job.benchmark, seconds)
    got = default_scale.default_costs(runs, tmp_path)
    assert got[4].seconds == 450  # cvb's two seeds, not the common recipe's run
    assert got[4].how == "median of 2 measured train_utility job(s) with the same settings"
    assert got[5].seconds == 450 and "its sweep's base defense" in got[5].how
    assert got[6].seconds is None


def test_a_sweeps_variant_is_estimated_from_its_base_defense(tmp_path):
    runs = [
        utility_job(1, "soteria"),
        utility_job(2, "soteria-prune0.6"),  # the base at another strength
        utility_job(3, "soteria-prune0.6", model="lenet"),  # another model: no stand-in
        utility_job(4, "noise-std0.1"),  # a base never measured
        utility_job(5, "soteria-prune0.9"),  # a variant measured: not its base's seconds
        utility_job(6, "soteria", seed=1),  # the base's other seed
    ]
    write_tsv(tmp_path, runs[0].benchmark, 1500)
    write_tsv(tmp_path, runs[4].benchmark, 100)
    got = default_scale.default_costs(runs, tmp_path)
    assert got[2].seconds == 1500 and got[2].kind == "estimated"  # soteria itself, not 0.9
    assert "its sweep's base defense" in got[2].how
    assert got[3].seconds is None and got[4].seconds is None
    assert got[6].seconds == 1500 and got[6].how.startswith("median of 1 ")


def test_what_is_left_counts_the_jobs_still_to_run_with_their_measured_or_estimated_seconds(
    tmp_path,
):
    full = jobs.Dag(jobs.parse_dry_run(dry_run_text(SHARED)))
    # training x and table a are done; y reruns (its settings changed since its measured run)
    left = [job for job in full.jobs if job.jobid in (0, 2, 5, 6)]
    write_tsv(tmp_path, "results/benchmarks/train/x.tsv", 50)
    write_tsv(tmp_path, "results/benchmarks/train/y.tsv", 40)
    text = costs.remaining(full, left, default_scale.default_costs(full.jobs, tmp_path), cores=2)
    assert text.startswith("# What is left of `all` here: 3 jobs")  # `all` itself is no work
    assert "| train | 1 | 40 s | 0 |" in text
    assert "| report | 1 | unmeasured | 1 |" in text and "| claims | 1 | unmeasured | 1 |" in text
    # two cores cannot finish sooner than the longest job: 40 s, not 40 / 2
    assert "Wall time on 2 cores: ≥ 40 s at best." in text
    assert text.rstrip().endswith("- report: 1\n- claims: 1")  # rules without a method


def test_what_is_left_names_the_methods_of_its_unmeasured_jobs(tmp_path):
    runs = [
        utility_job(1, "soteria"),
        utility_job(2, "soteria", seed=1),  # estimated from seed 0
        utility_job(3, "refiner"),
        utility_job(4, "refiner-epsilon0.1"),  # a variant counts with its base
        utility_job(5, "none", recipe="censor"),
    ]
    write_tsv(tmp_path, runs[0].benchmark, 1500)
    text = costs.remaining(
        jobs.Dag(runs), runs[1:], default_scale.default_costs(runs, tmp_path), cores=2
    )
    assert "| train_utility | 4 | ≥ 25.0 min | 3 |" in text
    assert text.rstrip().endswith("- train_utility: refiner 2, none 1")
    many = [utility_job(10 + i, f"d{i}") for i in range(costs.SHOWN_METHODS + 2)]
    unmeasured = default_scale.default_costs(many, tmp_path)
    ((rule, counts),) = costs.unmeasured_methods(many, jobs.Dag(many).producer, unmeasured)
    # the first eight named, then the rest counted
    assert rule == "train_utility" and counts.endswith(", d7 1, 2 more 2")


def test_a_pause_of_the_whole_run_is_not_counted_as_a_jobs_time(tmp_path):
    """A benchmark file counts a `kill -STOP` of the run in every job it held; with the run's
    pauses, a job's seconds are its record's start to end less the pauses in it."""
    job = jobs.Job(
        jobid=1, rule="train_utility", output=("results/u.json",), benchmark="results/b/u.tsv"
    )
    out = tmp_path / job.output[0]
    out.parent.mkdir(parents=True)
    out.write_bytes(b"x")
    os.utime(out, (5000.0, 5000.0))
    bench = tmp_path / job.benchmark
    bench.parent.mkdir(parents=True)
    bench.write_text("s\th:m:s\n4000.0\t1:06:40\n")  # 1000 s of work, 3000 s held paused
    metadata = tmp_path / ".snakemake" / "metadata"
    metadata.mkdir(parents=True)
    name = base64.urlsafe_b64encode(job.output[0].encode()).decode()
    record = {"rule": "train_utility", "incomplete": False, "starttime": 1000.0, "endtime": 5000.0}
    (metadata / name).write_text(json.dumps(record))
    assert default_scale.own_measurement(job, tmp_path).seconds == pytest.approx(4000.0)
    at = datetime.fromtimestamp  # the pauses file is read on the machine's clock
    pauses = [(at(a), at(b)) for a, b in [(500, 1500), (2000, 3000), (4500, 9000), (6000, 7000)]]
    cost = default_scale.own_measurement(job, tmp_path, pauses)
    assert cost.seconds == pytest.approx(4000.0 - 500 - 1000 - 500)
    assert "less its pauses" in cost.how
    costs_of = default_scale.default_costs([job], tmp_path, pauses)
    assert costs_of[1].seconds == pytest.approx(2000.0)


def test_the_cost_table_of_a_run_paused_as_a_whole_leaves_its_pauses_out(tmp_path, monkeypatch):
    """`costs.py --project DIR --pauses FILE`: every target's default-scale seconds are the
    run's own (in DIR, not this checkout), each finished job's less the pauses in it."""
    project, out = tmp_path / "run", tmp_path / "here"
    x = jobs.Job(jobid=4, rule="train", output=("ck/x.pt",), benchmark=SHARED[1][2]["benchmark"])
    (project / "ck").mkdir(parents=True)
    (project / x.output[0]).write_bytes(b"x")
    os.utime(project / x.output[0], (5000.0, 5000.0))
    write_tsv(project, x.benchmark, 4000)  # 1000 s of work, 3000 s held paused
    write_tsv(project, SHARED[2][2]["benchmark"], 40)  # y: no record, its benchmark file
    metadata = project / ".snakemake" / "metadata"
    metadata.mkdir(parents=True)
    record = {"rule": "train", "incomplete": False, "starttime": 1000.0, "endtime": 5000.0}
    (metadata / base64.urlsafe_b64encode(b"ck/x.pt").decode()).write_text(json.dumps(record))
    at = datetime.fromtimestamp  # the pauses file is read on the machine's clock
    pauses = tmp_path / "pauses"
    pauses.write_text(f"{at(2000).isoformat()} {at(5000).isoformat()}\n")

    cwds = []

    def dry_run(configfiles, target=None, cwd=costs.ROOT, forceall=True):
        cwds.append(cwd)
        return dry_run_text(SHARED)

    monkeypatch.setattr(costs, "dry_run", dry_run)
    monkeypatch.setattr(costs, "full_rows", lambda *args: {})  # the full scale: tested above
    monkeypatch.setattr(costs, "ROOT", out)
    (out / "results").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # main() moves to ROOT; this puts the tests' directory back
    argv = ["costs.py", "--project", str(project), "--pauses", str(pauses)]
    monkeypatch.setattr(sys, "argv", argv)
    assert costs.main() == 0
    assert cwds == [project, project]  # the run's checkout, for params.yaml and the paper overlay
    table = (out / "results/costs.md").read_text()
    assert f"measured in {project} (less the pauses in {pauses})" in table
    # x: 4000 s of record less 3000 s paused; y: its benchmark file; the rest unmeasured
    assert "| **all** (every job once) | 6 (6) | ≥ 17.3 min (2 measured); 4 unmeasured" in table
    assert "| 0 | not a target of this configuration | - |" in table  # not in the paper overlay
    monkeypatch.setattr(sys, "argv", argv[:3])  # without the pauses: the benchmark file's 4000 s
    costs.main()
    assert "≥ 1.1 h (2 measured)" in (out / "results/costs.md").read_text()
