rule prepare_data:
    output:
        data="data/prepared/{dataset}.pt",
        manifest="data/prepared/{dataset}.json",
    params:
        settings=lambda w: job_settings(config, "prepare", **w),
        raw_dir=config["data"]["raw_dir"],
    conda:
        "../../environment.yml"
    log:
        "results/logs/prepare/{dataset}.log",
    shell:
        "gradinv prepare --settings {params.settings:q} --raw-dir {params.raw_dir:q} "
        "--out {output.data} > {log} 2>&1"


rule partition_data:
    input:
        "data/prepared/{dataset}.pt",
    output:
        "data/partitions/{dataset}.json",
    params:
        settings=lambda w: job_settings(config, "partition", **w),
    conda:
        "../../environment.yml"
    log:
        "results/logs/partition/{dataset}.log",
    shell:
        "gradinv partition --settings {params.settings:q} --dataset {wildcards.dataset} "
        "--prepared-dir data/prepared --out {output} > {log} 2>&1"


rule floor:
    # The floor: the public split's mean image, scored against every victim beside the attack
    # (an attack that does not beat it on the undefended victims decides no defense claim).
    input:
        data="data/prepared/{dataset}.pt",
        partition="data/partitions/{dataset}.json",
    output:
        "data/floor/{dataset}.pt",
    params:
        settings=lambda w: job_settings(config, "floor", **w),
    priority: PRIORITY["floor"]  # before any cell (common.smk)
    conda:
        "../../environment.yml"
    log:
        "results/logs/floor/{dataset}.log",
    shell:
        "gradinv floor --settings {params.settings:q} --prepared-dir data/prepared "
        "--partition {input.partition} --out {output} > {log} 2>&1"


rule select_victim:
    input:
        "data/prepared/{dataset}.pt",
    output:
        "results/victims/{dataset}/b{bs}/victim{victim}.pt",
    params:
        stride=config["capture"]["victim_stride"],
        distinct="--distinct-labels" if config["capture"]["distinct_labels"] else "",
    priority: PRIORITY["select_victim"]  # before any cell (common.smk)
    conda:
        "../../environment.yml"
    log:
        "results/logs/victims/{dataset}/b{bs}/victim{victim}.log",
    shell:
        "gradinv victim --dataset {wildcards.dataset} --prepared-dir data/prepared "
        "--victim {wildcards.victim} --batch-size {wildcards.bs} --stride {params.stride} "
        "{params.distinct} --out {output} > {log} 2>&1"


rule prepared_data:
    # Every dataset the pipeline trains on and every client partition (dvc.yaml's `data` stage).
    input:
        prepared_files(config),
