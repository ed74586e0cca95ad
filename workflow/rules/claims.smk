# The papers' qualitative claims (workflow/claims.yaml), each checked against the result files
# of this configuration: results/claims.csv and results/claims.md. A claim on a table this
# configuration does not build is reported as not evaluated.

CLAIMS_FILE = pipeline.project_file(workflow, "workflow/claims.yaml")


rule claims:
    input:
        claims=CLAIMS_FILE,
        results=lambda w: claim_inputs(config, CLAIMS_FILE),  # read when the rule is needed
    output:
        csv="results/claims.csv",
        markdown="results/claims.md",
        summary="results/claims_summary.json",
        page=report(
            "results/claims.html",
            caption="../report/claims.rst",
            category=ACROSS,
            subcategory="Claims",
            labels={"result": "verdicts"},
        ),
    params:
        settings=lambda w: job_settings(config, "claims"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/claims.log",
    shell:
        "gradinv claims --settings {params.settings:q} --claims {input.claims} "
        "--results-dir results --out-dir results > {log} 2>&1"
