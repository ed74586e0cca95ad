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


# One job scores a cell's first n victims (a table of n victims reads v{n}.json): scoring takes far
# less than starting a process that imports torch, so a job per victim would mostly start up.
rule score:
    input:
        reconstructions=lambda w: cell_files(w, f"results/attacks/{RUN}/{{attack}}/victim{{v}}.pt"),
        victims=lambda w: cell_files(w, "results/victims/{dataset}/b{bs}/victim{v}.pt"),
        captures=lambda w: cell_captures(w),
        floor="data/floor/{dataset}.pt",
        assets=lambda w: metric_assets(config, w.dataset),  # noise_ratio's network
    output:
        f"results/metrics/{RUN}/{{attack}}/v{{n}}.json",
    params:
        settings=lambda w: job_settings(config, "score", **w),
    threads: config["threads_per_job"]
    conda:
        "../../environment.yml"
    log:
        f"results/logs/score/{RUN}/{{attack}}/v{{n}}.log",
    benchmark:
        f"results/benchmarks/score/{RUN}/{{attack}}/v{{n}}.tsv"
    shell:
        "gradinv score --settings {params.settings:q} --reconstructions {input.reconstructions} "
        "--victim-files {input.victims} --captures {input.captures} --floor {input.floor} "
        "--out {output} --model {wildcards.model} --round {wildcards.round} > {log} 2>&1"
