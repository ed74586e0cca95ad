# Refiner's Table 4 (results/refiner_table4_time.csv): the seconds one client spends on its
# defended update in a round, per defense and model, on the initial model; no training, no attack.

if "client_time" in config:
    CLIENT_TIME = config["client_time"]

    rule client_time:
        input:
            data="data/prepared/{dataset}.pt",
            assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
        output:
            "results/client_time/{dataset}/{model}/{defense}.json",
        params:
            settings=lambda w: job_settings(config, "client_time", **w),
        threads: config["threads_per_job"]
        resources:
            **cluster.resources(config, "client_time"),
        conda:
            "../../environment.yml"
        log:
            "results/logs/client_time/{dataset}/{model}/{defense}.log",
        benchmark:
            "results/benchmarks/client_time/{dataset}/{model}/{defense}.tsv"
        shell:
            "gradinv client-time --settings {params.settings:q} --prepared-dir data/prepared "
            "--out {output} > {log} 2>&1"

    rule report_client_time:
        input:
            expand(
                "results/client_time/{dataset}/{model}/{defense}.json",
                dataset=CLIENT_TIME["dataset"],
                model=CLIENT_TIME["models"],
                defense=CLIENT_TIME["defenses"],
            ),
        output:
            csv="results/refiner_table4_time.csv",
            markdown="results/refiner_table4_time.md",
            page=report(
                "results/refiner_table4_time.html",
                caption="../report/client_time.rst",
                category=PAPERS["refiner_"],
                subcategory="Table 4",
                labels={"result": "table"},
            ),
            vs_paper="results/refiner_table4_time_vs_paper.csv",
        params:
            settings=lambda w: job_settings(config, "client_time_report"),
        conda:
            "../../environment.yml"
        log:
            "results/logs/report/refiner_table4_time.log",
        shell:
            "gradinv report-client-time --settings {params.settings:q} --runs {input} "
            "--out-dir results > {log} 2>&1"
