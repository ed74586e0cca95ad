# gradinv: the whole pipeline at a glance. Each stage's rules live in workflow/rules/<stage>.smk:
#   data     prepare a dataset once; partition it among the clients; pick each victim's batch
#   train    federated training under each defense, checkpoints per round
#   capture  the update a victim shares, after its defense (what the server sees)
#   attack   reconstruct the victim's images from that update; score them against the originals
#   report   paper tables, figures and the comparison with the published numbers
# Usage: snakemake results/table1.csv --cores all   (see README.md)

import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from gradinv.config import job_settings, validate
from gradinv.settings import ConfigError

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.pop("MLFLOW_RUN_ID", None)
# Jobs call `gradinv`; find it beside the Python that runs Snakemake, even if no venv is active.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"


configfile: "params.yaml"


try:
    validate(config, source="params.yaml (with any --configfile overlays)")
except ConfigError as err:
    raise WorkflowError(str(err)) from None


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/capture.smk"
include: "workflow/rules/attack.smk"
include: "workflow/rules/report.smk"


onstart:
    shell(
        "gradinv tracking-init --experiment {e} --enabled {on} > /dev/null".format(
            e=config["tracking"]["experiment"],
            on=str(config["tracking"]["enabled"]).lower(),
        )
    )


rule all:
    default_target: True
    input:
        expand("results/{table}.csv", table=config["tables"]),
