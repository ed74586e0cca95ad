# Refiner's evaluation network (its Appendix D): trained on a dataset's public split, mixed with
# uniform noise at ratios 0, 0.1, ..., 1, to predict the ratio. Refiner's defense reads it (its
# privacy term) and so does the noise_ratio metric; DVC tracks the file (stage `evalnet`).


rule train_evalnet:
    input:
        data="data/prepared/{dataset}.pt",
        partition="data/partitions/{dataset}.json",
    output:
        network="data/evalnet/{dataset}.pt",
        calibration="data/evalnet/{dataset}_calibration.png",
    params:
        settings=lambda w: job_settings(config, "evalnet", **w),
    threads: config["threads_per_job"]
    priority: PRIORITY["train_evalnet"]  # before any cell (common.smk)
    resources:
        **cluster.resources(config, "train_evalnet"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/evalnet/{dataset}.log",
    benchmark:
        "results/benchmarks/evalnet/{dataset}.tsv"
    shell:
        "gradinv train-evalnet --settings {params.settings:q} --prepared-dir data/prepared "
        "--partition {input.partition} --out {output.network} > {log} 2>&1"


rule evaluation_networks:
    # Every evaluation network the tables and studies read (dvc.yaml's `evalnet` stage).
    input:
        evaluation_network_files(config),
