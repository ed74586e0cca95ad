rule train:
    input:
        data="data/prepared/{dataset}.pt",
        partition="data/partitions/{dataset}.json",
        assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
    output:
        checkpoints=expand(
            "results/checkpoints/{{dataset}}/{{model}}/{{defense}}/round{r}.pt",
            r=config["fl"]["checkpoint_rounds"],
        ),
        summary="results/train/{dataset}/{model}/{defense}/summary.json",
    params:
        settings=lambda w: job_settings(config, "train", **w),
    threads: config["threads_per_job"]
    resources:
        **cluster.resources(config, "train"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/train/{dataset}/{model}/{defense}.log",
    benchmark:
        "results/benchmarks/train/{dataset}/{model}/{defense}.tsv"
    shell:
        "gradinv train --settings {params.settings:q} --prepared-dir data/prepared "
        "--partition {input.partition} --checkpoints {output.checkpoints} "
        "--summary {output.summary} > {log} 2>&1"


rule trained_models:
    # Every checkpoint a table uses (dvc.yaml's `train` stage builds this target).
    input:
        sorted(
            {
                f"results/train/{d}/{m}/{f}/summary.json"
                for name, t in config["tables"].items()
                for d in t["datasets"]
                for m in table_models(config, name)
                for f in table_runs(config, name)
            }
        ),
