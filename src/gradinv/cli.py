"""``gradinv <verb>``: the entry points that Snakemake's rules call, one verb per stage.

Rules pass each job's settings as one JSON string (``--settings``), made from the validated
params.yaml by :func:`gradinv.jobs.job_settings`; a verb never reads params.yaml itself, so
Snakemake's ``--configfile`` overlays reach every job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.pop("MLFLOW_RUN_ID", None)


def _settings(text: str) -> dict[str, Any]:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--settings is not valid JSON ({err})") from None


def _cmd_validate(a: argparse.Namespace) -> None:
    from gradinv.config import load

    load(a.params, tuple(a.configfile or ()))
    print(f"{' + '.join([a.params, *(a.configfile or ())])}: valid")


def _cmd_guard(a: argparse.Namespace) -> None:
    from gradinv import config_guard

    if a.action == "install":
        print(
            f"gradinv: Snakemake's configuration files are read as data from now on "
            f"({config_guard.write_pth()})"
        )
    elif config_guard.pth_path().exists():
        print(f"gradinv: the guard is installed ({config_guard.pth_path()})")
    else:
        raise SystemExit(
            "gradinv: the guard is not installed in this environment: Snakemake would render a "
            "configuration file with __use_yte__ (running its Python) before gradinv sees it. "
            "Run: gradinv guard install"
        )


def _cmd_prepare(a: argparse.Namespace) -> None:
    from gradinv.stages.prepare import prepare

    prepare(_settings(a.settings), Path(a.raw_dir), Path(a.out))


def _cmd_partition(a: argparse.Namespace) -> None:
    from gradinv.stages.prepare import partition

    partition(_settings(a.settings), a.dataset, Path(a.prepared_dir), Path(a.out))


def _cmd_train(a: argparse.Namespace) -> None:
    from gradinv.stages.train import run

    checkpoints: dict[int | str, Path] = {}
    for path in a.checkpoints:
        stem = Path(path).stem  # round<N>, or final (the last round, whichever it is)
        checkpoints[stem if stem == "final" else int(stem.removeprefix("round"))] = Path(path)
    partition = Path(a.partition) if a.partition else None
    run(_settings(a.settings), Path(a.prepared_dir), partition, checkpoints, Path(a.summary))


def _cmd_victim(a: argparse.Namespace) -> None:
    from gradinv.stages.capture import select_victim

    select_victim(
        a.dataset,
        Path(a.prepared_dir),
        a.victim,
        a.batch_size,
        a.stride,
        Path(a.out),
        distinct_labels=a.distinct_labels,
    )


def _cmd_capture(a: argparse.Namespace) -> None:
    from gradinv.stages.capture import run

    run(
        _settings(a.settings),
        Path(a.checkpoint),
        [Path(p) for p in a.victim_files],
        Path(a.out),
        first=a.first,
        prepared_dir=Path(a.prepared_dir),
    )


def _cmd_attack(a: argparse.Namespace) -> None:
    from gradinv.stages.attack import run

    generator = Path(a.generator) if a.generator else None
    run(_settings(a.settings), Path(a.capture), Path(a.out), generator_file=generator)


def _cmd_train_generator(a: argparse.Namespace) -> None:
    from gradinv.stages.generator import train

    train(_settings(a.settings), Path(a.prepared_dir), Path(a.partition), Path(a.out))


def _cmd_floor(a: argparse.Namespace) -> None:
    from gradinv.stages.floor import run

    run(_settings(a.settings), Path(a.prepared_dir), Path(a.partition), Path(a.out))


def _cmd_train_evalnet(a: argparse.Namespace) -> None:
    from gradinv.stages.evalnet import run

    run(_settings(a.settings), Path(a.prepared_dir), Path(a.partition), Path(a.out))


def _cmd_fetch_generator(a: argparse.Namespace) -> None:
    from gradinv.stages.generator import fetch

    fetch(_settings(a.settings), Path(a.out))


def _cmd_score(a: argparse.Namespace) -> None:
    from gradinv.stages.score import run

    run(
        _settings(a.settings),
        [Path(p) for p in a.reconstructions],
        [Path(p) for p in a.victim_files],
        [Path(p) for p in a.captures],
        Path(a.out),
        model=a.model,
        round=a.round,
        floor=Path(a.floor),
    )


def _cmd_report(a: argparse.Namespace) -> None:
    from gradinv.stages.report import run

    run(
        _settings(a.settings),
        [Path(p) for p in a.metrics],
        Path(a.out_dir),
        summaries=[Path(p) for p in a.summaries],
        undefended=[Path(p) for p in a.undefended],
    )


def _cmd_report_convergence(a: argparse.Namespace) -> None:
    from gradinv.stages.convergence import run

    run(
        _settings(a.settings),
        [Path(p) for p in a.curves],
        [Path(p) for p in a.clients],
        Path(a.out_dir),
        official=[Path(p) for p in a.official],
    )


def _cmd_report_utility(a: argparse.Namespace) -> None:
    from gradinv.stages.utility import run

    run(_settings(a.settings), [Path(p) for p in a.summaries], Path(a.out_dir), a.name)


def _cmd_claims(a: argparse.Namespace) -> None:
    from gradinv.stages.claims import run

    run(_settings(a.settings), Path(a.claims), Path(a.results_dir), Path(a.out_dir))


def _cmd_client_time(a: argparse.Namespace) -> None:
    from gradinv.stages.client_time import measure

    measure(_settings(a.settings), Path(a.prepared_dir), Path(a.out))


def _cmd_report_client_time(a: argparse.Namespace) -> None:
    from gradinv.stages.client_time import report

    report(_settings(a.settings), [Path(p) for p in a.runs], Path(a.out_dir))


def _cmd_frontier(a: argparse.Namespace) -> None:
    from gradinv.stages.frontier import run

    run(_settings(a.settings), Path(a.cells), Path(a.out_dir))


def _cmd_report_public(a: argparse.Namespace) -> None:
    from gradinv.stages.public import run

    run(_settings(a.settings), [Path(p) for p in a.metrics], Path(a.prepared_dir), Path(a.out_dir))


def _cmd_tracking_init(a: argparse.Namespace) -> None:
    from gradinv.config import project_root
    from gradinv.tracking import init_store

    init_store(project_root(), a.experiment, enabled=a.enabled == "true")


def _cmd_tracking_flush(a: argparse.Namespace) -> None:
    from gradinv.stages.tracking import flush

    logged = flush()
    if logged:
        print(f"gradinv: logged {logged} pending run(s) to MLflow", file=sys.stderr)


def _cmd_schema(a: argparse.Namespace) -> None:
    from gradinv import methods

    if a.write:
        print(f"wrote {methods.write()}")
    else:
        print(json.dumps(methods.generate(), indent=1, sort_keys=True))
        print(f"gradinv: --write stores it in {methods.PATH}", file=sys.stderr)


def _cmd_mlflow_ui(a: argparse.Namespace) -> None:
    from gradinv.config import project_root
    from gradinv.tracking import mlflow_ui_command, mlflow_ui_url

    print(mlflow_ui_command(project_root()))
    print(f"gradinv: then open {mlflow_ui_url()}", file=sys.stderr)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gradinv", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)

    def verb(name: str, func: Any, help: str, settings: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help)
        sp.set_defaults(func=func)
        if settings:
            sp.add_argument("--settings", required=True, help="job settings as JSON")
        return sp

    sp = verb("validate", _cmd_validate, "validate params.yaml (and overlays)", settings=False)
    sp.add_argument("--params", default="params.yaml")
    sp.add_argument("--configfile", action="append", help="overlay, as Snakemake's --configfile")

    sp = verb(
        "schema",
        _cmd_schema,
        "each method's settings schema and facts, from the registries (after changing a method)",
        settings=False,
    )
    sp.add_argument("--write", action="store_true", help="store it where validation reads it")

    sp = verb(
        "guard",
        _cmd_guard,
        "make Snakemake read configuration files as data in this environment (make env does)",
        settings=False,
    )
    sp.add_argument("action", choices=["install", "status"])

    sp = verb("prepare", _cmd_prepare, "prepare a dataset under data/prepared")
    sp.add_argument("--raw-dir", required=True)
    sp.add_argument("--out", required=True)

    sp = verb("partition", _cmd_partition, "split a prepared dataset among the clients")
    sp.add_argument("--dataset", required=True)
    sp.add_argument("--prepared-dir", required=True)
    sp.add_argument("--out", required=True)

    sp = verb("train", _cmd_train, "federated training under one defense")
    sp.add_argument("--prepared-dir", required=True)
    sp.add_argument("--partition", help="the clients' partition (not used by the official loop)")
    sp.add_argument(
        "--checkpoints", nargs="+", required=True, help="round<N>.pt files, or final.pt"
    )
    sp.add_argument("--summary", required=True)

    sp = verb("victim", _cmd_victim, "select a victim's private batch", settings=False)
    sp.add_argument("--dataset", required=True)
    sp.add_argument("--prepared-dir", required=True)
    sp.add_argument("--victim", type=int, required=True)
    sp.add_argument("--batch-size", type=int, required=True)
    sp.add_argument("--stride", type=int, required=True)
    sp.add_argument(
        "--distinct-labels", action="store_true", help="no two images of a batch share a label"
    )
    sp.add_argument("--out", required=True)

    sp = verb("capture", _cmd_capture, "capture victims' defended updates")
    sp.add_argument("--checkpoint", required=True)
    sp.add_argument("--victim-files", nargs="+", required=True, help="victims first, first + 1")
    sp.add_argument("--first", type=int, default=0, help="the first file's victim")
    sp.add_argument("--out", required=True, help="one file, every victim's capture")
    sp.add_argument(
        "--prepared-dir", default="data/prepared", help="public images (CENSOR source: public)"
    )

    sp = verb("attack", _cmd_attack, "reconstruct victims' images from their captures")
    sp.add_argument("--capture", required=True, help="a capture job's file (its victims)")
    sp.add_argument("--out", required=True, help="one file, every victim's reconstruction")
    sp.add_argument("--generator", help="the generator file (generative-prior attacks)")

    sp = verb(
        "train-generator", _cmd_train_generator, "train the attacker's generator on public data"
    )
    sp.add_argument("--prepared-dir", required=True)
    sp.add_argument("--partition", required=True, help="holds the public split")
    sp.add_argument("--out", required=True)

    sp = verb("floor", _cmd_floor, "the public split's mean image every attack is compared with")
    sp.add_argument("--prepared-dir", required=True)
    sp.add_argument("--partition", required=True, help="holds the public split")
    sp.add_argument("--out", required=True)

    sp = verb(
        "train-evalnet",
        _cmd_train_evalnet,
        "train Refiner's evaluation network (noise ratio) on public data",
    )
    sp.add_argument("--prepared-dir", required=True)
    sp.add_argument("--partition", required=True, help="holds the public split")
    sp.add_argument("--out", required=True)

    sp = verb("fetch-generator", _cmd_fetch_generator, "fetch and verify published weights")
    sp.add_argument("--out", required=True)

    sp = verb("score", _cmd_score, "score a cell's reconstructions and log the attack runs")
    sp.add_argument(
        "--reconstructions", nargs="+", required=True, help="the attack files of victims 0, 1, ..."
    )
    sp.add_argument("--victim-files", nargs="+", required=True, help="the same victims' batches")
    sp.add_argument("--captures", nargs="+", required=True, help="their captures (client side)")
    sp.add_argument("--out", required=True)
    sp.add_argument("--model", required=True)
    sp.add_argument("--round", type=int, required=True)
    sp.add_argument("--floor", required=True, help="the floor image (gradinv floor)")

    def table_inputs(sp: argparse.ArgumentParser) -> None:
        """The score files a table's report reads (each record names its reconstruction and
        private batch), and where it writes."""
        sp.add_argument("--metrics", nargs="+", required=True)
        sp.add_argument("--out-dir", required=True)

    sp = verb("report", _cmd_report, "render a paper table from metric files")
    table_inputs(sp)
    sp.add_argument(
        "--summaries", nargs="*", default=[], help="the defenses' FL runs (accuracy, PMM)"
    )
    sp.add_argument(
        "--undefended",
        nargs="*",
        default=[],
        help="other tables' undefended runs of its attacks (a table without an undefended row)",
    )

    sp = verb(
        "report-convergence",
        _cmd_report_convergence,
        "render CENSOR's convergence study (Figs. 7-8, Table VI) from training summaries",
    )
    sp.add_argument("--curves", nargs="+", required=True)
    sp.add_argument("--clients", nargs="+", required=True)
    sp.add_argument(
        "--official", nargs="*", default=[], help="summaries of the official code's loop"
    )
    sp.add_argument("--out-dir", required=True)

    sp = verb(
        "report-utility",
        _cmd_report_utility,
        "render the utility table (each defense's accuracy beside no defense) from summaries",
    )
    sp.add_argument("--summaries", nargs="+", required=True)
    sp.add_argument("--out-dir", required=True)
    sp.add_argument(
        "--name", default="utility", help="utility, or utility_<recipe>: the files' stem"
    )

    sp = verb(
        "report-public",
        _cmd_report_public,
        "draw CENSOR's Fig. 10 and measure the pull toward the public class",
    )
    table_inputs(sp)
    sp.add_argument("--prepared-dir", default="data/prepared")

    sp = verb("claims", _cmd_claims, "check the papers' claims against the result files")
    sp.add_argument("--claims", default="workflow/claims.yaml")
    sp.add_argument("--results-dir", default="results")
    sp.add_argument("--out-dir", default="results")

    sp = verb("client-time", _cmd_client_time, "time one client's defended update (Table 4)")
    sp.add_argument("--prepared-dir", default="data/prepared")
    sp.add_argument("--out", required=True)

    sp = verb("report-client-time", _cmd_report_client_time, "Refiner's Table 4 from the timings")
    sp.add_argument("--runs", nargs="+", required=True)
    sp.add_argument("--out-dir", default="results")

    sp = verb("frontier", _cmd_frontier, "utility against privacy for every defense's sweep")
    sp.add_argument("--cells", required=True, help="the frontier table's long table")
    sp.add_argument("--out-dir", default="results")

    sp = verb("tracking-init", _cmd_tracking_init, "create the MLflow store", settings=False)
    sp.add_argument("--experiment", required=True)
    sp.add_argument("--enabled", choices=["true", "false"], default="true")

    verb(
        "tracking-flush",
        _cmd_tracking_flush,
        "log the runs that jobs left pending (tracking.defer) to MLflow",
        settings=False,
    )

    verb("mlflow-ui", _cmd_mlflow_ui, "print the command that browses the runs", settings=False)
    return p


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run one verb. Failures a user can act on end with one clear message and an exit code:
    2 a configuration error, 3 a corrupted or missing input file or a refused download, and
    :data:`gradinv.resources.RESOURCE_EXIT_CODE` when memory or disk ran out.

    Nothing heavy is imported before the arguments are parsed: ``gradinv --help`` answers at
    once, and each verb imports what it needs (torch only where it runs a model)."""
    args = parser().parse_args(argv)
    # Snakemake stops running jobs with SIGTERM (after Ctrl-C, or --keep-going off): exit through
    # Python so that temporary files are removed and nothing half-written is left behind.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        args.func(args)
    except Exception as err:
        code = _explained(err, args.verb)
        if code is None:
            raise
        return code
    return 0


def _explained(err: Exception, verb: str) -> int | None:
    """Print what a user can act on and return its exit code; None for any other failure.
    The error types are imported here, once there is an error, and a configuration error's
    before the others: the data and generator modules they live in load torch (2 s), which
    `gradinv validate` does not otherwise need."""
    from gradinv.settings import ConfigError

    if isinstance(err, ConfigError):
        print(f"gradinv {verb}: configuration error: {err}", file=sys.stderr)
        return 2
    from gradinv.data.base import DownloadError
    from gradinv.generators import WeightsError
    from gradinv.io import CorruptFileError
    from gradinv.resources import RESOURCE_EXIT_CODE, explain_failure

    if isinstance(err, CorruptFileError | DownloadError | FileNotFoundError | WeightsError):
        print(f"gradinv {verb}: bad input: {err}", file=sys.stderr)
        return 3
    if isinstance(err, MemoryError | OSError | RuntimeError):
        message = explain_failure(err)
        if message is None:
            return None
        print(f"gradinv {verb}: {message}", file=sys.stderr)
        return RESOURCE_EXIT_CODE
    return None


if __name__ == "__main__":
    sys.exit(main())
