# CENSOR's convergence study (its Figs. 7-8 and Table VI): FL training on non-IID clients, with
# the study's own partition and FL setting (params.yaml `convergence`); no attack involved. The
# loop of CENSOR's official code (central training, `convergence.official_loop`) runs beside it.
# The model after the last round is `final.pt`, a path that does not change with the number of
# rounds: Snakemake then reruns a job whose settings changed (its params trigger) even when only
# summary.json is asked for; a path with the round in it would leave the old run standing.

CONVERGENCE = config["convergence"]


rule partition_convergence:
    input:
        "data/prepared/{dataset}.pt",
    output:
        "data/partitions/{dataset}.convergence.json",
    params:
        settings=lambda w: job_settings(config, "convergence_partition", **w),
    conda:
        "../../environment.yml"
    log:
        "results/logs/partition/{dataset}.convergence.log",
    shell:
        "gradinv partition --settings {params.settings:q} --dataset {wildcards.dataset} "
        "--prepared-dir data/prepared --out {output} > {log} 2>&1"


rule train_convergence:
    input:
        data="data/prepared/{dataset}.pt",
        partition="data/partitions/{dataset}.convergence.json",
        assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
    output:
        checkpoint="results/convergence/{dataset}/{model}/{defense}/k{k}/final.pt",
        summary="results/convergence/{dataset}/{model}/{defense}/k{k}/summary.json",
    params:
        settings=lambda w: job_settings(config, "convergence_train", **w),
    threads: config["threads_per_job"]
    resources:
        **cluster.resources(config, "train_convergence"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/convergence/{dataset}/{model}/{defense}/k{k}.log",
    benchmark:
        "results/benchmarks/convergence/{dataset}/{model}/{defense}/k{k}.tsv"
    shell:
        "gradinv train --settings {params.settings:q} --prepared-dir data/prepared "
        "--partition {input.partition} --checkpoints {output.checkpoint} "
        "--summary {output.summary} > {log} 2>&1"


rule train_convergence_official:
    input:
        data="data/prepared/{dataset}.pt",
        assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
    output:
        checkpoint="results/convergence/{dataset}/{model}/{defense}/official/final.pt",
        summary="results/convergence/{dataset}/{model}/{defense}/official/summary.json",
    params:
        settings=lambda w: job_settings(config, "convergence_official", **w),
    threads: config["threads_per_job"]
    resources:
        **cluster.resources(config, "train_convergence_official"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/convergence/{dataset}/{model}/{defense}/official.log",
    benchmark:
        "results/benchmarks/convergence/{dataset}/{model}/{defense}/official.tsv"
    shell:
        "gradinv train --settings {params.settings:q} --prepared-dir data/prepared "
        "--checkpoints {output.checkpoint} --summary {output.summary} > {log} 2>&1"


rule report_convergence:
    input:
        curves=convergence_runs(CONVERGENCE["defenses"], [convergence_curves_k(config)]),
        clients=convergence_runs(CONVERGENCE["clients_defenses"], CONVERGENCE["clients_per_round"]),
        official=official_loop_runs(),
    output:
        csv="results/convergence.csv",
        accuracy=report(
            "results/fig7_accuracy.png",
            caption="../report/convergence.rst",
            category=CENSOR,
            subcategory="Figures 7-8 and Table VI",
            labels={"result": "Fig. 7: accuracy"},
        ),
        loss=report(
            "results/fig8_loss.png",
            caption="../report/convergence.rst",
            category=CENSOR,
            subcategory="Figures 7-8 and Table VI",
            labels={"result": "Fig. 8: loss"},
        ),
        clients="results/table6_clients.csv",
        markdown="results/table6_clients.md",
        page=report(
            "results/table6_clients.html",
            caption="../report/table6.rst",
            category=CENSOR,
            subcategory="Figures 7-8 and Table VI",
            labels={"result": "Table VI"},
        ),
        vs_paper="results/table6_clients_vs_paper.csv",
    params:
        settings=lambda w: job_settings(config, "convergence_report"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/report/convergence.log",
    shell:
        "gradinv report-convergence --settings {params.settings:q} --curves {input.curves} "
        "--clients {input.clients} --official {input.official} --out-dir results > {log} 2>&1"
