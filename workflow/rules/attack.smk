rule attack:
    input:
        capture=lambda w: capture_file(config, w),
        generator=lambda w: attack_generator_file(config, w.attack, w.dataset),
    output:
        f"results/attacks/{RUN}/{{attack}}/victim{{victim}}.pt",
    params:
        settings=lambda w: job_settings(config, "attack", **w),
        generator=lambda w, input: f"--generator {input.generator}" if input.generator else "",
    threads: config["threads_per_job"]
    resources:
        gpu=GPU_PER_JOB,
    conda:
        "../../environment.yml"
    log:
        f"results/logs/attack/{RUN}/{{attack}}/victim{{victim}}.log",
    benchmark:
        f"results/benchmarks/attack/{RUN}/{{attack}}/victim{{victim}}.tsv"
    shell:
        "gradinv attack --settings {params.settings:q} --capture {input.capture} --out {output} "
        "{params.generator} > {log} 2>&1"


rule score:
    input:
        reconstruction=f"results/attacks/{RUN}/{{attack}}/victim{{victim}}.pt",
        victim="results/victims/{dataset}/b{bs}/victim{victim}.pt",
        capture=lambda w: capture_file(config, w),
        floor="data/floor/{dataset}.pt",
        assets=lambda w: metric_assets(config, w.dataset),  # noise_ratio's network
    output:
        f"results/metrics/{RUN}/{{attack}}/victim{{victim}}.json",
    params:
        settings=lambda w: job_settings(config, "score", **w),
    threads: config["threads_per_job"]
    conda:
        "../../environment.yml"
    log:
        f"results/logs/score/{RUN}/{{attack}}/victim{{victim}}.log",
    benchmark:
        f"results/benchmarks/score/{RUN}/{{attack}}/victim{{victim}}.tsv"
    shell:
        "gradinv score --settings {params.settings:q} --reconstruction {input.reconstruction} "
        "--victim-file {input.victim} --capture {input.capture} --floor {input.floor} "
        "--out {output} "
        "--model {wildcards.model} "
        "--round {wildcards.round} --victim {wildcards.victim} > {log} 2>&1"
