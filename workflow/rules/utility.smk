# What the defenses cost in accuracy: FL training runs per defense and seed, under a recipe: the
# utility study's (`common`: params.yaml `utility.fl` merged over `fl`, the same for every
# defense) or a paper's own (`recipes.<name>.fl`: how its code trains). No attack involved. As in
# the convergence study, the model after the last round is `final.pt`, a path independent of the
# number of rounds. results/utility.csv: the common recipe's runs of `utility.defenses`, their
# accuracy over the seeds beside training without a defense (results/utility_runs.csv: each
# run); results/utility_<recipe>.csv: the same under a paper's recipe, for its `defenses`.

RECIPES = config.get("recipes", {})
# the recipes whose clients are their own (recipes.<name>.partition: CENSOR's non-IID split)
PARTITIONED = [name for name, recipe in RECIPES.items() if recipe.get("partition")]


rule partition_recipe:
    input:
        "data/prepared/{dataset}.pt",
    output:
        "data/partitions/{dataset}.{recipe}.json",
    wildcard_constraints:
        recipe="|".join(PARTITIONED) or "(?!)",
    params:
        settings=lambda w: job_settings(config, "recipe_partition", **w),
    conda:
        "../../environment.yml"
    log:
        "results/logs/partition/{dataset}.{recipe}.log",
    shell:
        "gradinv partition --settings {params.settings:q} --dataset {wildcards.dataset} "
        "--prepared-dir data/prepared --out {output} > {log} 2>&1"


rule train_utility:
    input:
        data="data/prepared/{dataset}.pt",
        partition=lambda w: recipe_partition_file(config, w.recipe, w.dataset),
        assets=lambda w: defense_assets(config, w.defense, w.dataset),  # Refiner's network
    output:
        checkpoint="results/utility/{recipe}/{dataset}/{model}/{defense}/seed{seed}/final.pt",
        summary="results/utility/{recipe}/{dataset}/{model}/{defense}/seed{seed}/summary.json",
    wildcard_constraints:
        recipe="|".join(["common", *RECIPES]),
    params:
        settings=lambda w: job_settings(config, "utility_train", **w),
    threads: config["threads_per_job"]
    # The longest jobs of `all` (Refiner's runs on the ResNets and the ViT take hours): started
    # as soon as they can be, so that no core idles at the end while one of them runs alone.
    priority: PRIORITY["train_utility"]
    resources:
        **cluster.resources(config, "train_utility"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/utility/{recipe}/{dataset}/{model}/{defense}/seed{seed}.log",
    benchmark:
        "results/benchmarks/utility/{recipe}/{dataset}/{model}/{defense}/seed{seed}.tsv"
    shell:
        "gradinv train --settings {params.settings:q} --prepared-dir data/prepared "
        "--partition {input.partition} --checkpoints {output.checkpoint} "
        "--summary {output.summary} > {log} 2>&1"


rule report_utility:
    input:
        utility_runs("common", config["utility"]["defenses"]),
    output:
        csv="results/utility.csv",
        runs="results/utility_runs.csv",
        markdown="results/utility.md",
        page=report(
            "results/utility.html",
            caption="../report/utility.rst",
            category=ACROSS,
            subcategory="Utility",
            labels={"result": "common recipe"},
        ),
    params:
        settings=lambda w: job_settings(config, "utility_report"),
    conda:
        "../../environment.yml"
    log:
        "results/logs/report/utility.log",
    shell:
        "gradinv report-utility --settings {params.settings:q} --summaries {input} "
        "--out-dir results --name utility > {log} 2>&1"


rule report_utility_recipe:
    input:
        lambda w: utility_runs(w.recipe, RECIPES[w.recipe]["defenses"]),
    output:
        csv="results/utility_{recipe}.csv",
        runs="results/utility_{recipe}_runs.csv",
        markdown="results/utility_{recipe}.md",
        page=report(
            "results/utility_{recipe}.html",
            caption="../report/utility.rst",
            category=ACROSS,
            subcategory="Utility",
            labels=lambda w: {"result": f"{w.recipe}'s recipe"},
        ),
    wildcard_constraints:
        recipe="|".join(RECIPES) or "(?!)",
    params:
        settings=lambda w: job_settings(config, "utility_report", recipe=w.recipe),
    conda:
        "../../environment.yml"
    log:
        "results/logs/report/utility_{recipe}.log",
    shell:
        "gradinv report-utility --settings {params.settings:q} --summaries {input} "
        "--out-dir results --name utility_{wildcards.recipe} > {log} 2>&1"
