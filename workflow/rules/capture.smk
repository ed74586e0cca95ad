rule capture:
    input:
        checkpoint="results/checkpoints/{dataset}/{model}/{defense}/round{round}.pt",
        victim="results/victims/{dataset}/b{bs}/victim{victim}.pt",
        data="data/prepared/{dataset}.pt",  # public images (CENSOR, DCS²: `public`)
        assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
    output:
        f"results/captures/{RUN}/victim{{victim}}.pt",
    params:
        settings=lambda w: job_settings(config, "capture", **w),
    threads: config["threads_per_job"]
    resources:
        gpu=GPU_PER_JOB,
    conda:
        "../../environment.yml"
    log:
        f"results/logs/capture/{RUN}/victim{{victim}}.log",
    benchmark:
        f"results/benchmarks/capture/{RUN}/victim{{victim}}.tsv"
    shell:
        "gradinv capture --settings {params.settings:q} --checkpoint {input.checkpoint} "
        "--victim-file {input.victim} --victim {wildcards.victim} --out {output} "
        "--prepared-dir data/prepared > {log} 2>&1"


# A malicious server (Imprint) sends a model its attack changed: the victim's update is captured
# on that model, one capture per such attack (the job's settings carry the attack's block).
use rule capture as capture_malicious with:
    output:
        f"results/captures/{RUN}/{{attack}}/victim{{victim}}.pt",
    wildcard_constraints:
        attack="|".join(malicious_attacks(config)) or "(?!)",
    log:
        f"results/logs/capture/{RUN}/{{attack}}/victim{{victim}}.log",
    benchmark:
        f"results/benchmarks/capture/{RUN}/{{attack}}/victim{{victim}}.tsv"
