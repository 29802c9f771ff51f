"""devlab's simulated GPU memory against memory figures published from real GPUs
(docs/gpu-memory-validation.md).

Run: .venv/bin/python benchmarks/memory_published.py [--full] [--markdown] [PROGRAM ...]

Each program in `benchmarks/data/memory_published/` (one small .py each, its header citing its
source and quoting the printed output) runs in a fresh subprocess on one simulated GPU modeled
on the GPU the figure came from (the `model` column of `published.csv`), and reports the
figures it printed there. The script prints, for each row of `published.csv`: the program,
the GPU, the figure (allocated, peak or reserved), the published bytes, devlab's bytes and the
error; the target is allocated and peak within 5 %, reserved within 10 %.
docs/gpu-memory-validation.md explains every miss.

Programs whose float16 matrix products take minutes on a CPU run their float16 parts only
with `--full` (rows marked "--full" otherwise). PROGRAM names (file names, with or without
.py) run only those.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "memory_published"
TARGETS = {"allocated": 0.05, "peak": 0.05, "reserved": 0.10}

# Runs one program on a fresh simulated GPU; `report(key, bytes)` prints a line this script reads.
_RUNNER = """
import runpy, sys
from devlab.config import simulate_gpus
simulate_gpus(1, model=sys.argv[2])
def report(key, value):
    print(f"@@figure {key} {int(value)}", flush=True)
runpy.run_path(sys.argv[1], init_globals={"report": report}, run_name="__main__")
"""


@dataclass(frozen=True)
class Row:
    program: str
    figure: str
    kind: str
    published_gpu: str
    model: str
    published: int
    printed: str
    full_only: bool


def rows() -> list[Row]:
    with open(DATA / "published.csv", newline="") as f:
        return [Row(r["program"], r["figure"], r["kind"], r["published_gpu"], r["model"],
                    int(r["published_bytes"]), r["printed"], r["full_only"] == "1")
                for r in csv.DictReader(f)]


def run(program: str, model: str, full: bool) -> dict[str, int]:
    """The figures `program` reports on a simulated `model`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MEMPUB_FULL="1" if full else "0")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _RUNNER, str(DATA / program),
                           model], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{program} on {model} failed:\n{proc.stdout}\n{proc.stderr}")
    figures = {}
    for line in proc.stdout.splitlines():
        if line.startswith("@@figure "):
            _, key, value = line.split()
            figures[key] = int(value)
    return figures


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", nargs="*", help="run only these programs")
    parser.add_argument("--full", action="store_true", help="also the float16 parts (slow)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    wanted = {p if p.endswith(".py") else p + ".py" for p in args.programs}
    table = [r for r in rows() if not wanted or r.program in wanted]
    if wanted - {r.program for r in table}:
        parser.error(f"no such program: {', '.join(sorted(wanted - {r.program for r in table}))}")
    results: dict[tuple[str, str], dict[str, int]] = {}
    for r in table:
        if (r.program, r.model) not in results:
            results[r.program, r.model] = run(r.program, r.model, args.full)
    header = ("program", "GPU (devlab model)", "figure", "kind", "published", "devlab", "error",
              "target")
    lines = []
    for r in table:
        got = results[r.program, r.model].get(r.figure)
        target = TARGETS[r.kind]
        if got is None:
            devlab, error, verdict = ("--full" if r.full_only and not args.full else "none"), "", ""
        else:
            err = (got - r.published) / r.published
            devlab, error = f"{got:,} B ({_mib(got)})", f"{err:+.1%}"
            verdict = "within" if abs(err) <= target else "MISS"
        lines.append((r.program.removesuffix(".py"), f"{r.published_gpu} ({r.model})", r.figure,
                      r.kind, f"{r.published:,} B ({_mib(r.published)})", devlab, error,
                      f"{verdict} {target:.0%}".strip()))
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
        return
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for ln in lines:
        print("  ".join(c.ljust(w) for c, w in zip(ln, widths, strict=True)))


if __name__ == "__main__":
    main()
