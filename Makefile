# gradinv: `make table1` reproduces CENSOR's Table I (embedded scale); `make test` runs the tests.
# Both create the project's virtual environment (.venv) first if it is missing.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch and torchvision must come as a matching pair (a torchvision built for another torch fails
# to import); pip installs these two together, before anything else can pull in another torch.
TORCH := torch==2.14.1 torchvision==0.29.1
CORES ?= all
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: env table1 all report dvc-lock test test-fast lint dryrun gpu-check mlflow-ui clean

env: $(VENV)/.installed $(VENV)/.guarded

# Snakemake reads configuration files with gradinv's reader, as data (gradinv.config_guard).
$(VENV)/.guarded: $(VENV)/.installed src/gradinv/config_guard.py
	$(BIN)/gradinv guard install
	touch $@

# pip byte-compiles what it installs (its default; keep it): Python would compile a module on its
# first import instead, but where PYTHONDONTWRITEBYTECODE is set (as on the development machine)
# it keeps nothing, and every job would compile torch from source again (about 22 s of CPU).
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[all]" $(TORCH)
	$(BIN)/python -m pip check
	$(BIN)/python -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
	touch $@

table1: env
	$(BIN)/snakemake results/table1.csv --cores $(CORES)

all: env
	$(BIN)/snakemake --cores $(CORES)

# One browsable page of what the run built: every table, figure and the claims, by paper.
# REPORT_TARGETS: the targets it covers, which must be built (default: all, after `make all`;
# after `make table1`: REPORT_TARGETS=results/table1.csv);
# CONFIG: an overlay (make report CONFIG=tests/configs/micro.yaml REPORT_TARGETS=results/table1.csv);
# the report is then in the overlay's run_dir (runs/micro/results/report.html).
REPORT_TARGETS ?= all
report: env
	$(BIN)/snakemake $(REPORT_TARGETS) --report results/report.html $(if $(CONFIG),--configfile $(CONFIG))

# dvc.lock as `dvc repro` leaves it for the stages every checkout can afford to run (the
# prepared data, the attacker's generators, the evaluation networks: minutes on 2 cores);
# tests/test_workflow.py fails when a stage it records was run on other code or settings.
dvc-lock: env
	rm -f dvc.lock  # a stage recorded before, run on other code, would stay stale
	$(BIN)/dvc repro data generators evalnet

# --durations: the slowest tests close every run, to see where CI's time goes
test: env
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=25

test-fast: env
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q -m "not slow"

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakemake --lint

dryrun: env
	$(BIN)/snakemake -n results/table1.csv
	$(BIN)/snakemake -n results/table1.csv --configfile workflow/configs/paper.yaml

# One GPU, about 7 minutes (6.9 on an H200): the paper overlay's Table I on a thin slice and the
# GPU benchmarks (benchmarks/gpu_check.py); figures in results/benchmarks/gpu_check.{json,md}.
# Refuses without a GPU.
gpu-check: env
	$(BIN)/python benchmarks/gpu_check.py

mlflow-ui: env
	$$($(BIN)/gradinv mlflow-ui)

# clean: the default run's results and Snakemake state; an overlay's are in its run_dir
# (rm -rf runs/micro), its prepared data too.
clean:
	rm -rf results/* .snakemake && touch results/.gitkeep
