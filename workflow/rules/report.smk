rule report:
    wildcard_constraints:
        table="|".join(config["tables"]),
    input:
        metrics=lambda w: table_score_files(config, w.table),  # each record names its files
        summaries=lambda w: table_utility_runs(config, w.table),  # accuracy, PMM
        # another table's undefended runs of its attacks, where it has none: do they work?
        undefended=lambda w: undefended_score_files(config, w.table),
    output:
        csv="results/{table}.csv",
        markdown="results/{table}.md",
        vs_paper="results/{table}_vs_paper.csv",
        cells="results/{table}_cells.csv",
        victims_values="results/{table}_victims.csv",  # the claims pair these, victim by victim
        training="results/{table}_training.csv",  # and these (accuracy, PMM), seed by seed
        headline="results/{table}_headline.json",  # `dvc metrics show`
        figure=table_report("results/figures/{table}.png", "figure", "figure"),
        grid=table_report("results/figures/{table}_grid.png", "grid", "reconstructions"),
        # the table, its figure and the paper's numbers beside ours
        page=table_report("results/{table}.html", "table", "table"),
    params:
        settings=lambda w: job_settings(config, "table", table=w.table),
    conda:
        "../../environment.yml"
    log:
        "results/logs/report/{table}.log",
    benchmark:
        "results/benchmarks/report/{table}.tsv"
    shell:
        "gradinv report --settings {params.settings:q} --metrics {input.metrics} "
        "--summaries {input.summaries} --undefended {input.undefended} --out-dir results "
        "> {log} 2>&1"


if "fig10_public" in config["tables"]:

    rule report_public:
        # CENSOR's Fig. 10: reconstructions under directions drawn from one public class.
        input:
            metrics=table_score_files(config, "fig10_public"),
            # its drift is measured on the images themselves, so these are inputs (a table's
            # grid only illustrates: rule report draws the ones on disk and counts the others)
            reconstructions=table_attack_files(config, "fig10_public"),
            victims=sorted(set(table_victim_files(config, "fig10_public"))),
            data=expand("data/prepared/{d}.pt", d=config["tables"]["fig10_public"]["datasets"]),
        output:
            figure=report(
                "results/fig10_public.png",
                caption="../report/fig10_public.rst",
                category=CENSOR,
                subcategory="Figure 10",
                labels={"result": "reconstructions"},
            ),
            drift="results/fig10_public_drift.csv",
        params:
            settings=lambda w: job_settings(config, "public_report"),
        conda:
            "../../environment.yml"
        log:
            "results/logs/report/fig10_public.log",
        shell:
            "gradinv report-public --settings {params.settings:q} --metrics {input.metrics} "
            "--prepared-dir data/prepared --out-dir results > {log} 2>&1"


if "frontier_runs" in config["tables"]:

    rule report_frontier:
        # Every defense at each strength of its sweep: PMM against privacy under the strongest
        # attack run against it (results/frontier.csv, results/frontier.png).
        input:
            "results/frontier_runs_cells.csv",
        output:
            csv="results/frontier.csv",
            figure=report(
                "results/frontier.png",
                caption="../report/frontier.rst",
                category=ACROSS,
                subcategory="Utility against privacy",
                labels={"result": "frontier"},
            ),
        params:
            settings=lambda w: job_settings(config, "frontier"),
        conda:
            "../../environment.yml"
        log:
            "results/logs/report/frontier.log",
        shell:
            "gradinv frontier --settings {params.settings:q} --cells {input} "
            "--out-dir results > {log} 2>&1"
