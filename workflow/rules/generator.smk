# The attacker's generators (GGL, GIAS, GIFD): trained here on a dataset's public split, or
# published weights fetched and verified by sha256 (gradinv.generators.files).


rule train_generator:
    input:
        data="data/prepared/{dataset}.pt",
        partition="data/partitions/{dataset}.json",
    output:
        generator="data/generators/{generator}/{dataset}.pt",
        samples="data/generators/{generator}/{dataset}_samples.png",
    wildcard_constraints:
        generator=generator_names(config, trained=True),
    params:
        settings=lambda w: job_settings(config, "generator", **w),
    threads: config["threads_per_job"]
    priority: PRIORITY["train_generator"]  # before any cell (common.smk)
    resources:
        **cluster.resources(config, "train_generator"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/generator/{generator}/{dataset}.log",
    benchmark:
        "results/benchmarks/generator/{generator}/{dataset}.tsv"
    shell:
        "gradinv train-generator --settings {params.settings:q} --prepared-dir data/prepared "
        "--partition {input.partition} --out {output.generator} > {log} 2>&1"


rule fetch_generator:
    output:
        "data/generators/{generator}/weights.pt",
    wildcard_constraints:
        generator=generator_names(config, trained=False),
    params:
        settings=lambda w: job_settings(config, "generator", **w),
    priority: PRIORITY["fetch_generator"]  # before any cell (common.smk)
    conda:
        "../../environment.yml"
    log:
        "results/logs/generator/{generator}/fetch.log",
    shell:
        "gradinv fetch-generator --settings {params.settings:q} --out {output} > {log} 2>&1"


rule generators:
    # Every generator a table's attacks use (dvc.yaml's `generators` stage builds this target).
    input:
        generator_files(config),
