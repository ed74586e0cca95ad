# gradinv: the whole pipeline at a glance. Each stage's rules live in workflow/rules/<stage>.smk:
#   data     prepare a dataset once; partition it among the clients; pick each victim's batch
#   generator  the attacker's generator (GGL, GIAS, GIFD): trained on public data, or fetched
#   evalnet  Refiner's evaluation network (its privacy term, the noise_ratio metric), on public data
#   train    federated training under each defense, checkpoints per round
#   capture  the update a victim shares, after its defense (what the server sees; a malicious
#            server's attack, Imprint, first changes the model it sends)
#   attack   reconstruct the victim's images from that update; score them against the originals
#   report   paper tables, figures and the comparison with the published numbers
#   convergence  FL training on non-IID clients under CENSOR (its Figs. 7-8, Table VI)
#   utility  FL training under each defense: its accuracy beside no defense (utility.csv)
#   client_time  the seconds a client spends on its defended update (Refiner's Table 4)
#   claims   the papers' qualitative claims checked against the results (claims.md)
# Usage: snakemake results/table1.csv --cores all   (see README.md and docs/)

from gradinv.config import table_models
from gradinv.jobs import (
    attack_generator_file,
    capture_file,
    convergence_curves_k,
    defense_assets,
    evaluation_network_files,
    generator_files,
    generator_names,
    job_settings,
    malicious_attacks,
    prepared_files,
    metric_assets,
    recipe_partition_file,
    victim_groups,
)
from gradinv.sweeps import table_runs
from gradinv.table_inputs import (
    ACROSS,
    CENSOR,
    PAPERS,
    claim_inputs,
    report_category,
    report_subcategory,
    table_attack_files,
    table_score_files,
    table_victim_files,
    table_utility_runs,
    undefended_score_files,
)
from gradinv import cluster, pipeline

pipeline.setup_environment(workflow.basedir)


configfile: f"{workflow.basedir}/params.yaml"  # a path that holds after workdir: below


report: "workflow/report/workflow.rst"  # snakemake --report results/report.html (make report)


pipeline.validated(config, workflow.configfiles)


envvars: *pipeline.export_runtime(config, workflow.overwrite_configfiles)


# Every path below (results/, data/, Snakemake's .snakemake/) is the run's: run_dir, each
# configuration its own, so that switching overlays reruns nothing still valid.
workdir: pipeline.run_dir(config, workflow)


if workflow.is_main_process:
    pipeline.clear_stale_lock()


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/generator.smk"
include: "workflow/rules/evalnet.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/capture.smk"
include: "workflow/rules/attack.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/convergence.smk"
include: "workflow/rules/utility.smk"
include: "workflow/rules/client_time.smk"
include: "workflow/rules/claims.smk"


# On a cluster these run on the submit host, not through the scheduler (gradinv.cluster says why);
# the `localrules:` directive, for a list computed here (some rules exist only in some configs).
workflow.localrules(*(name for name in cluster.LOCAL_RULES if name in rules._rules))


onstart:
    pipeline.claim_lock(workflow.persistence)
    shell(
        "gradinv tracking-init --experiment {e} --enabled {on} > /dev/null".format(
            e=config["tracking"]["experiment"],
            on=str(config["tracking"]["enabled"]).lower(),
        )
    )
    shell("gradinv tracking-flush")  # what an interrupted workflow left pending


rule all:
    default_target: True
    input:
        expand("results/{table}.csv", table=config["tables"]),
        "results/fig7_accuracy.png",
        "results/table6_clients.csv",
        "results/utility.csv",
        expand("results/utility_{recipe}.csv", recipe=config.get("recipes", {})),
        "results/claims.md",
        ["results/fig10_public.png"] if "fig10_public" in config["tables"] else [],
        ["results/frontier.png"] if "frontier_runs" in config["tables"] else [],
        ["results/refiner_table4_time.csv"] if "client_time" in config else [],


onsuccess:
    shell("gradinv tracking-flush")  # the jobs' deferred MLflow runs (tracking.defer)
    pipeline.release_lock(workflow.persistence)
    pipeline.report_tracking_failures()


onerror:
    shell("gradinv tracking-flush")
    pipeline.release_lock(workflow.persistence)
    pipeline.report_tracking_failures()
    cluster.report_slurm_failures(log, config)  # which limit to raise, when SLURM stopped a job
