rule capture:
    input:
        checkpoint="results/checkpoints/{dataset}/{model}/{defense}/round{round}.pt",
        victim="results/victims/{dataset}/b{bs}/victim{victim}.pt",
        data="data/prepared/{dataset}.pt",  # public images, for CENSOR's `source: public`
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
    shell:
        "gradinv capture --settings {params.settings:q} --checkpoint {input.checkpoint} "
        "--victim-file {input.victim} --victim {wildcards.victim} --out {output} "
        "--prepared-dir data/prepared > {log} 2>&1"
