# One job attacks victims_per_job victims of a cell, one after another (victims first to last):
# an attack of a few seconds costs less than starting a process that imports torch (4-5 s), and
# each victim's seed and result do not depend on how the victims are grouped. A victim finished
# before an interruption is kept (results/.progress/) and not attacked again.
rule attack:
    input:
        capture=lambda w: capture_file(config, w),
        generator=lambda w: attack_generator_file(config, w.attack, w.dataset),
    output:
        f"results/attacks/{RUN}/{{attack}}/victims{{first}}-{{last}}.pt",
    params:
        settings=lambda w: job_settings(config, "attack", **w),
        generator=lambda w, input: f"--generator {input.generator}" if input.generator else "",
    threads: config["threads_per_job"]
    priority: PRIORITY["attack"]  # depth first (common.smk)
    group:
        cluster.group(config, "attack")
    resources:
        **cluster.resources(config, "attack"),
    conda:
        "../../environment.yml"
    log:
        f"results/logs/attack/{RUN}/{{attack}}/victims{{first}}-{{last}}.log",
    benchmark:
        f"results/benchmarks/attack/{RUN}/{{attack}}/victims{{first}}-{{last}}.tsv"
    shell:
        "gradinv attack --settings {params.settings:q} --capture {input.capture} --out {output} "
        "{params.generator} > {log} 2>&1"


# One job scores a cell's first n victims (a table of n victims reads v{n}.json): scoring takes far
# less than starting a process that imports torch, so a job per victim would mostly start up.
rule score:
    input:
        reconstructions=cell_attack_files,
        victims=lambda w: cell_files(w, "results/victims/{dataset}/b{bs}/victim{v}.pt"),
        captures=lambda w: cell_captures(w),
        floor="data/floor/{dataset}.pt",
        assets=lambda w: metric_assets(config, w.dataset),  # noise_ratio's network
    output:
        f"results/metrics/{RUN}/{{attack}}/v{{n}}.json",
    params:
        settings=lambda w: job_settings(config, "score", **w),
    threads: config["threads_per_job"]
    priority: PRIORITY["score"]  # depth first (common.smk)
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
