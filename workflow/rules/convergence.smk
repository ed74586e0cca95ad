# CENSOR's convergence study (its Figs. 7-8 and Table VI): FL training on non-IID clients, with
# the study's own partition and FL setting (params.yaml `convergence`); no attack involved.

CONVERGENCE = config["convergence"]
CONVERGENCE_ROUNDS = convergence_fl(config, convergence_curves_k(config))["rounds"]


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
    output:
        checkpoint=f"results/convergence/{{dataset}}/{{model}}/{{defense}}/k{{k}}/round{CONVERGENCE_ROUNDS}.pt",
        summary="results/convergence/{dataset}/{model}/{defense}/k{k}/summary.json",
    params:
        settings=lambda w: job_settings(config, "convergence_train", **w),
    threads: config["threads_per_job"]
    resources:
        gpu=GPU_PER_JOB,
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


rule report_convergence:
    input:
        curves=convergence_runs(CONVERGENCE["defenses"], [convergence_curves_k(config)]),
        clients=convergence_runs(CONVERGENCE["clients_defenses"], CONVERGENCE["clients_per_round"]),
    output:
        csv="results/convergence.csv",
        accuracy="results/fig7_accuracy.png",
        loss="results/fig8_loss.png",
        clients="results/table6_clients.csv",
        markdown="results/table6_clients.md",
        vs_paper="results/table6_clients_vs_paper.csv",
    params:
        settings=lambda w: job_settings(config, "convergence_report"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/report/convergence.log",
    shell:
        "gradinv report-convergence --settings {params.settings:q} --curves {input.curves} "
        "--clients {input.clients} --out-dir results > {log} 2>&1"
