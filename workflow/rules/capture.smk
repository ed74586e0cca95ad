# One job captures the victims one attack job attacks (victims first to last, victims_per_job of
# them): a capture costs less than starting a process that imports torch.
rule capture:
    input:
        checkpoint="results/checkpoints/{dataset}/{model}/{defense}/round{round}.pt",
        victims=lambda w: [
            f"results/victims/{w.dataset}/b{w.bs}/victim{v}.pt"
            for v in range(int(w.first), int(w.last) + 1)
        ],
        data="data/prepared/{dataset}.pt",  # public images (CENSOR, DCS²: `public`)
        assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
    output:
        f"results/captures/{RUN}/victims{{first}}-{{last}}.pt",
    params:
        settings=lambda w: job_settings(config, "capture", **w),
    threads: config["threads_per_job"]
    priority: PRIORITY["capture"]  # depth first (common.smk)
    group:
        cluster.group(config, "capture")
    resources:
        **cluster.resources(config, "capture"),
    conda:
        "../../environment.yml"
    log:
        f"results/logs/capture/{RUN}/victims{{first}}-{{last}}.log",
    benchmark:
        f"results/benchmarks/capture/{RUN}/victims{{first}}-{{last}}.tsv"
    shell:
        "gradinv capture --settings {params.settings:q} --checkpoint {input.checkpoint} "
        "--victim-files {input.victims} --first {wildcards.first} --out {output} "
        "--prepared-dir data/prepared > {log} 2>&1"


# A malicious server (Imprint) sends a model its attack changed: the victim's update is captured
# on that model, one capture per such attack (the job's settings carry the attack's block).
use rule capture as capture_malicious with:
    output:
        f"results/captures/{RUN}/{{attack}}/victims{{first}}-{{last}}.pt",
    wildcard_constraints:
        attack="|".join(malicious_attacks(config)) or "(?!)",
    log:
        f"results/logs/capture/{RUN}/{{attack}}/victims{{first}}-{{last}}.log",
    benchmark:
        f"results/benchmarks/capture/{RUN}/{{attack}}/victims{{first}}-{{last}}.tsv"
