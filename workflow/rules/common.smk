# Path patterns and the input lists the report rule needs. No other logic lives here.

from types import SimpleNamespace

wildcard_constraints:
    dataset=r"[A-Za-z0-9_-]+",
    model=r"[A-Za-z0-9_-]+",
    defense=r"[A-Za-z0-9_.-]+",  # "." : a sweep's value (noise-std0.01)
    attack=r"[A-Za-z0-9_-]+",
    round=r"\d+",
    bs=r"\d+",
    victim=r"\d+",
    n=r"\d+",


RUN = "{dataset}/{model}/{defense}/r{round}_b{bs}"

# Jobs on a GPU each hold one `gpu` token; the profile grants as many as there are GPUs, and the
# job takes a GPU no other job holds (gradinv.resources.acquire_device).
GPU_PER_JOB = 0 if config["device"] == "cpu" else 1


def cell_files(w, pattern):
    """A cell's file of each of its first n victims (the score rule's wildcard n)."""
    return [pattern.format(**dict(w.items()), v=v) for v in range(int(w.n))]


def cell_captures(w):
    """The capture behind each of a cell's first n victims."""
    return [
        capture_file(config, SimpleNamespace(**dict(w.items()), victim=str(v)))
        for v in range(int(w.n))
    ]


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
