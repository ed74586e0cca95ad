# Path patterns, the input lists the rules need, and how a table's outputs enter the report.

from types import SimpleNamespace

from gradinv.config import NAME, RUN_NAME

# The names params.yaml may give (gradinv.config.NAME; validation refuses any other).
wildcard_constraints:
    dataset=NAME,
    model=NAME,
    defense=RUN_NAME,  # a sweep's point holds its value: noise-std0.01
    attack=NAME,
    table=NAME,
    recipe=NAME,
    generator=NAME,
    seed=r"\d+",
    k=r"\d+",
    round=r"\d+",
    bs=r"\d+",
    victim=r"\d+",
    first=r"\d+",
    last=r"\d+",
    n=r"\d+",


RUN = "{dataset}/{model}/{defense}/r{round}_b{bs}"

# Which ready job runs first (higher first; the rest are 0): the FL utility runs, then what a
# cell waits on, then each cell depth first. Why: docs/pipeline.md (the paragraph on priorities).
PRIORITY = {
    "train_utility": 10,
    **dict.fromkeys(
        ("select_victim", "floor", "train_evalnet", "train_generator", "fetch_generator"), 4
    ),
    "score": 3,
    "attack": 2,
    "capture": 1,
}

# Each rule's resources (a `gpu` token for the jobs that may use a GPU, a scheduler's memory and
# time limit) and its submission group come from gradinv.cluster: `**cluster.resources(config,
# "<rule>")` in the rule; the profile grants as many `gpu` tokens as there are GPUs, and each job
# takes a GPU no other job holds (gradinv.resources.acquire_device; on SLURM, the one it was given).


def cell_files(w, pattern):
    """A cell's file of each of its first n victims (the score rule's wildcard n)."""
    return [pattern.format(**dict(w.items()), v=v) for v in range(int(w.n))]


def cell_groups(w, files):
    """``files(first, last)`` for each job's run of victims among a cell's first n."""
    return [files(first, last) for first, last in victim_groups(int(w.n), config["victims_per_job"])]


def cell_attack_files(w):
    """The attack jobs' files that hold a cell's first n victims (victims_per_job a job)."""
    run = f"results/attacks/{RUN}/{{attack}}".format(**dict(w.items()))
    return cell_groups(w, lambda first, last: f"{run}/victims{first}-{last}.pt")


def cell_captures(w):
    """The capture jobs' files behind a cell's first n victims."""
    return cell_groups(
        w,
        lambda first, last: capture_file(
            config, SimpleNamespace(**dict(w.items()), first=first, last=last)
        ),
    )


def convergence_runs(defenses, clients):
    """Summaries of the convergence study's training runs (Figs. 7-8, Table VI)."""
    conv = config["convergence"]
    return expand(
        f"results/convergence/{conv['dataset']}/{conv['model']}/{{defense}}/k{{k}}/summary.json",
        defense=defenses,
        k=clients,
    )


def utility_runs(recipe, defenses):
    """The utility study's runs of `defenses` under `recipe` (common, or a paper's), every seed."""
    study = config["utility"]
    return expand(
        "results/utility/{recipe}/{dataset}/{model}/{defense}/seed{seed}/summary.json",
        recipe=recipe,
        dataset=study["dataset"],
        model=study["model"],
        defense=defenses,
        seed=study["seeds"],
    )


def official_loop_runs():
    """Summaries of the official code's loop in the convergence study (its second panel)."""
    conv = config["convergence"]
    return expand(
        f"results/convergence/{conv['dataset']}/{conv['model']}/{{defense}}/official/summary.json",
        defense=conv.get("official_loop", {}).get("defenses", []),
    )


def table_report(path, caption, result):
    """A table's output in the browsable report: under its paper and its table, with the
    caption workflow/report/<caption>.rst."""
    return report(
        path,
        caption=f"../report/{caption}.rst",
        category=lambda w: report_category(w.table),
        subcategory=lambda w: report_subcategory(config, w.table),
        labels={"result": result},
    )
