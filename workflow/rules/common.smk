# Path patterns and the input lists the report rule needs. No other logic lives here.

wildcard_constraints:
    dataset=r"[A-Za-z0-9_-]+",
    model=r"[A-Za-z0-9_-]+",
    defense=r"[A-Za-z0-9_.-]+",  # "." : a sweep's value (noise-std0.01)
    attack=r"[A-Za-z0-9_-]+",
    round=r"\d+",
    bs=r"\d+",
    victim=r"\d+",


RUN = "{dataset}/{model}/{defense}/r{round}_b{bs}"

# Jobs on a GPU each hold one `gpu` token; the profile grants as many as there are GPUs, and the
# job takes a GPU no other job holds (gradinv.resources.acquire_device).
GPU_PER_JOB = 0 if config["device"] == "cpu" else 1


def table_jobs(table, stage, ext):
    """Every per-victim file of `stage` that table `table` aggregates."""
    return table_files(config, table, stage, ext)


def table_victims_files(table):
    """The private batch behind each entry of table_jobs (same order)."""
    return table_victim_files(config, table)


def convergence_runs(defenses, clients):
    """Summaries of the convergence study's training runs (Figs. 7-8, Table VI)."""
    conv = config["convergence"]
    return expand(
        f"results/convergence/{conv['dataset']}/{conv['model']}/{{defense}}/k{{k}}/summary.json",
        defense=defenses,
        k=clients,
    )


def official_loop_runs():
    """Summaries of the official code's loop in the convergence study (its second panel)."""
    conv = config["convergence"]
    return expand(
        f"results/convergence/{conv['dataset']}/{conv['model']}/{{defense}}/official/summary.json",
        defense=conv.get("official_loop", {}).get("defenses", []),
    )
