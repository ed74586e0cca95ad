# The papers' qualitative claims (workflow/claims.yaml), each checked against the result files
# of this configuration: results/claims.csv and results/claims.md. A claim on a table this
# configuration does not build is reported as not evaluated.

from gradinv.claims import load_claims, result_file

CLAIMS_FILE = "workflow/claims.yaml"


def claim_inputs():
    built = set(claim_tables(config))
    tables = {c.check.table for c in load_claims(CLAIMS_FILE)}
    return sorted(str(result_file(t)) for t in tables & built)


rule claims:
    input:
        claims=CLAIMS_FILE,
        results=claim_inputs(),
    output:
        csv="results/claims.csv",
        markdown="results/claims.md",
    params:
        settings=lambda w: job_settings(config, "claims"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/claims.log",
    shell:
        "gradinv claims --settings {params.settings:q} --claims {input.claims} "
        "--results-dir results --out-dir results > {log} 2>&1"
