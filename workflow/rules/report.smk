rule report:
    input:
        metrics=lambda w: table_jobs(w.table, "metrics", "json"),
        reconstructions=lambda w: table_jobs(w.table, "attacks", "pt"),
        victims=lambda w: table_victims(w.table),
    output:
        csv="results/{table}.csv",
        markdown="results/{table}.md",
        vs_paper="results/{table}_vs_paper.csv",
        figure="results/figures/{table}.png",
        grid="results/figures/{table}_grid.png",
    params:
        settings=lambda w: job_settings(config, "table", table=w.table),
    conda:
        "../../environment.yml"
    log:
        "results/logs/report/{table}.log",
    shell:
        "gradinv report --settings {params.settings:q} --metrics {input.metrics} "
        "--reconstructions {input.reconstructions} --victims {input.victims} "
        "--out-dir results > {log} 2>&1"
