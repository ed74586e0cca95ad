# The utility table (results/utility.csv): FL training runs per defense and seed with the study's
# FL setting (params.yaml `utility`, merged over `fl`), on the main partition; the final test
# accuracy over the seeds beside training without a defense (results/utility_runs.csv: each run). No attack involved. As in the convergence study,
# the model after the last round is `final.pt`, a path independent of the number of rounds.

UTILITY = config["utility"]


rule train_utility:
    input:
        data="data/prepared/{dataset}.pt",
        partition="data/partitions/{dataset}.json",
        assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
    output:
        checkpoint="results/utility/{dataset}/{model}/{defense}/seed{seed}/final.pt",
        summary="results/utility/{dataset}/{model}/{defense}/seed{seed}/summary.json",
    params:
        settings=lambda w: job_settings(config, "utility_train", **w),
    threads: config["threads_per_job"]
    # The longest jobs of `all` (Refiner's runs on the ResNets and the ViT take hours): started
    # as soon as they can be, so that no core idles at the end while one of them runs alone.
    priority: 10
    resources:
        gpu=GPU_PER_JOB,
    conda:
        "../../environment.yml"
    log:
        "results/logs/utility/{dataset}/{model}/{defense}/seed{seed}.log",
    benchmark:
        "results/benchmarks/utility/{dataset}/{model}/{defense}/seed{seed}.tsv"
    shell:
        "gradinv train --settings {params.settings:q} --prepared-dir data/prepared "
        "--partition {input.partition} --checkpoints {output.checkpoint} "
        "--summary {output.summary} > {log} 2>&1"


rule report_utility:
    input:
        expand(
            "results/utility/{dataset}/{model}/{defense}/seed{seed}/summary.json",
            dataset=UTILITY["dataset"],
            model=UTILITY["model"],
            defense=UTILITY["defenses"],
            seed=UTILITY["seeds"],
        ),
    output:
        csv="results/utility.csv",
        runs="results/utility_runs.csv",
        markdown="results/utility.md",
    params:
        settings=lambda w: job_settings(config, "utility_report"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/report/utility.log",
    shell:
        "gradinv report-utility --settings {params.settings:q} --summaries {input} "
        "--out-dir results > {log} 2>&1"
