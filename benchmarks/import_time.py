"""What ``import cadence`` adds to a script's imports: fresh interpreters running
``import torch`` vs ``import torch, cadence``, and the same after ``from transformers import
GPT2LMHeadModel`` (what cadence adds for a Hugging Face user).

All four commands are alternated, ``--trials`` times each, each in a new interpreter
(:func:`_common.measure_command`: wall seconds from start to exit); reported per pair: the
median of each command and the median of the paired differences. ``startup.py`` gives the
other view: each command's absolute time and memory, as a ratio to ``import torch``.

Usage::

    python benchmarks/import_time.py            # 5 trials
    python benchmarks/import_time.py --trials 9 --markdown
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

if str(Path(__file__).resolve().parent) not in sys.path:  # _common: also via importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, child_env, format_table, loadavg, measure_command  # noqa: E402

__all__ = ["IMPORT_PAIRS", "import_time", "report", "main"]

#: Interpreter commands timed, as (baseline, with cadence) pairs.
IMPORT_PAIRS = (
    ("import torch", "import torch, cadence"),
    ("import torch; from transformers import GPT2LMHeadModel",
     "import torch; from transformers import GPT2LMHeadModel; import cadence"),
)


def import_time(trials: int) -> list[tuple[str, str, float, float, float]]:
    """For each pair of :data:`IMPORT_PAIRS`: the commands, the median wall seconds of each
    in fresh interpreters (all four commands alternated, ``trials`` times), and the median
    of the per-trial differences (what ``import cadence`` adds to the baseline)."""
    times: dict[str, list[float]] = {code: [] for pair in IMPORT_PAIRS for code in pair}
    for _ in range(trials):
        for code in times:
            done = measure_command([sys.executable, "-c", code], cwd=REPO, env=child_env())
            if done.returncode != 0:
                raise RuntimeError(f"{code!r} exited with {done.returncode}")
            times[code].append(done.wall_s)
    results = []
    for base, more in IMPORT_PAIRS:
        diffs = [b - a for a, b in zip(times[base], times[more])]
        results.append((base, more, statistics.median(times[base]), statistics.median(times[more]),
                        statistics.median(diffs)))
    return results


def report(results: list[tuple[str, str, float, float, float]], trials: int,
           markdown: bool) -> str:
    """The table: one row per command, the 'with cadence' rows saying what cadence adds."""
    rows = []
    for base, more, t_base, t_more, diff in results:
        rows.append([f"`{base}`", f"{t_base:.2f}", ""])
        rows.append([f"`{more}`", f"{t_more:.2f}", f"{diff:+.2f}"])
    return "\n".join([
        f"import time (benchmarks/import_time.py): fresh interpreters, wall seconds, median of "
        f"{trials}; 'cadence adds' = median of the paired differences",
        "",
        format_table(["command", "wall s", "cadence adds s"], rows, markdown),
    ])


def main(argv: Optional[list[str]] = None) -> int:
    """Measure and print the table. Returns 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5,
                        help="fresh interpreters per command (5)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    load_before = loadavg()
    results = import_time(args.trials)
    print(report(results, args.trials, args.markdown))
    print(f"\n- command: python {os.path.relpath(os.path.abspath(__file__), REPO)} "
          f"{' '.join(argv)}".rstrip())
    print(f"- machine: {os.cpu_count()} CPUs; load average (1/5/15 min) before / after: "
          f"{load_before} | {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
