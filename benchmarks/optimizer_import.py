"""What a job pays, past importing torch, for building its optimizer.

    python benchmarks/optimizer_import.py [--repeats 7]

A training job steps SGD and an attack job steps Adam. torch.optim imports ``torch._dynamo``, the
compiler's front end, for a compiler that no gradinv stage runs: the optimizer's constructor
calls a method wrapped in ``torch._disable_dynamo``, which imports it on its first call, and
every ``step`` imports it to mark graph breaks. ``benchmarks/startup.py`` times a stage module's
import alone, so this cost falls in a job's work there; this script measures it apart: in fresh
processes of one thread, as a job runs, the seconds of ``import torch``, of building SGD or Adam
for a tiny model, of its first and second step, and whether building it loaded
``torch._dynamo``, for torch.optim as installed and after ``eager_optimizers()`` (what every
stage's ``setup()`` calls, gradinv.stages.common), the two alternating. It prints the median,
range and n of each, as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = """
import json, sys, time
t = time.perf_counter()
import torch
imported = time.perf_counter() - t
torch.set_num_threads(1)
model = torch.nn.Linear(32, 10)
if sys.argv[2] == "eager":
    from gradinv.stages.common import eager_optimizers  # a stage imports it anyway: not timed
t = time.perf_counter()
if sys.argv[2] == "eager":
    eager_optimizers()  # timed as part of building the optimizer
optimizer = getattr(torch.optim, sys.argv[1])(model.parameters(), lr=0.01)
built = time.perf_counter() - t
dynamo = "torch._dynamo" in sys.modules
steps = []
for _ in range(2):
    t = time.perf_counter()
    model(torch.ones(4, 32)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    steps.append(time.perf_counter() - t)
print(json.dumps({"import torch": imported, "build the optimizer": built, "first step": steps[0],
                  "second step": steps[1], "dynamo": dynamo}))
"""


def probe(optimizer: str, way: str) -> dict[str, float | bool]:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", PROBE, optimizer, way]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="processes per optimizer and way")
    args = parser.parse_args(argv)
    ways = {"torch": "torch as installed", "eager": "after eager_optimizers()"}
    runs: dict[tuple[str, str], list[dict[str, float | bool]]] = {
        (name, way): [] for name in ("SGD", "Adam") for way in ways
    }
    for _ in range(args.repeats):  # alternating: the machine's drift falls on every column
        for (name, way), found in runs.items():
            found.append(probe(name, way))
    print("| optimizer | torch.optim | what | median (s) | range (s) | n |")
    print("|---|---|---|---:|---:|---:|")
    for (name, way), found in runs.items():
        for what in ("import torch", "build the optimizer", "first step", "second step"):
            values = [float(r[what]) for r in found]
            low, high = min(values), max(values)
            median = statistics.median(values)
            row = f"| {name} | {ways[way]} | {what} | {median:.2f} | {low:.2f}-{high:.2f} |"
            print(f"{row} {len(values)} |")
        loaded = sum(bool(r["dynamo"]) for r in found)
        print(f"| {name} | {ways[way]} | loaded torch._dynamo | {loaded} of {len(found)} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
