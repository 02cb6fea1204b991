"""Time to the first training step, and peak resident memory, of the overhead benchmark's
arms, each in a fresh process (CPU).

The arms and model are ``overhead.py``'s (:mod:`_arms`): ``raw`` (a plain PyTorch loop; its
process builds the same GPT-2 with ``transformers`` alone and never imports cadence),
``trainer`` (the Trainer as the quickstart sets it up) and ``bare`` (the Trainer with
everything optional off). Each trial runs every arm once in a new interpreter, arms
alternating, ``--trials`` times; per arm the medians of:

- import seconds (``import torch`` and ``transformers``, plus cadence for the Trainer arms);
- construct seconds: model build + optimizer (and Trainer) construction, after imports;
- first step seconds: construct + one training step;
- peak RSS MiB: the process's peak resident memory over its whole life (imports, build,
  ``--warmup`` steps, exit), measured the one way every benchmark here does
  (:func:`_common.measure_command`).

Usage::

    python benchmarks/first_step.py --markdown                 # 3 trials per arm
    python benchmarks/first_step.py --size null --trials 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

if str(Path(__file__).resolve().parent) not in sys.path:  # _common, _arms: also via importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _arms import ARM_TITLES, ARMS, MODEL_SIZES, build_arm, make_batches, set_threads  # noqa: E402
from _common import (  # noqa: E402
    REPO, check_minimums, child_env, format_table, loadavg, measure_command,
)  # noqa: E402

__all__ = ["child", "measure", "report", "parse_args", "main"]


def child(arm_name: str, threads: int, warmup: int, seed: int, log_interval: int,
          size: str) -> dict[str, float]:
    """In a fresh process: imports, time to the first step, then ``warmup - 1`` more steps.

    Returns:
        ``import_s``, ``construct_s``, ``first_step_s`` (seconds).
    """
    t_start = time.perf_counter()
    import torch  # noqa: F401

    if arm_name == "raw":
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401 (lazy modules)
    else:
        import cadence  # noqa: F401
        import cadence.models.gpt  # noqa: F401
    t_imported = time.perf_counter()
    set_threads(threads)
    model_kwargs = MODEL_SIZES[size]
    batches = make_batches(seed, model_kwargs)
    with tempfile.TemporaryDirectory(prefix="cadence-first-step-") as folder:
        t0 = time.perf_counter()
        arm = build_arm(arm_name, seed, batches, log_interval, folder, model_kwargs,
                        plain_raw=True)
        t1 = time.perf_counter()
        arm.run(1)
        t2 = time.perf_counter()
        arm.run(max(0, warmup - 1))
        arm.close()
    return {"import_s": t_imported - t_start, "construct_s": t1 - t0, "first_step_s": t2 - t0}


def measure(args: argparse.Namespace,
            log: Callable[[str], None]) -> dict[str, list[dict[str, float]]]:
    """``args.trials`` trials, each running every arm's :func:`child` once, in turn."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ARMS}
    for trial in range(args.trials):
        for name in ARMS:
            command = [sys.executable, os.path.abspath(__file__), "--child", name,
                       "--threads", str(args.threads), "--warmup", str(args.warmup),
                       "--seed", str(args.seed), "--log-interval", str(args.log_interval),
                       "--size", args.size]
            done = measure_command(command, cwd=REPO, env=child_env(), capture_output=True,
                                   timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"{name} child failed ({done.returncode}):\n{done.stderr}")
            record = json.loads((done.stdout or "").strip().splitlines()[-1])
            record["peak_rss_mib"] = done.peak_mib
            runs[name].append(record)
        log(f"trial {trial + 1}/{args.trials} done")
    return runs


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]],
           context: dict[str, str]) -> str:
    """The table: per arm, the medians over trials."""
    headers = ["arm", "import s", "construct s", "first step s", "peak RSS MiB"]
    rows = []
    for name in ARMS:
        medians = {key: statistics.median(r[key] for r in runs[name])
                   for key in ("import_s", "construct_s", "first_step_s", "peak_rss_mib")}
        rows.append([name, f"{medians['import_s']:.2f}", f"{medians['construct_s']:.3f}",
                     f"{medians['first_step_s']:.3f}", f"{medians['peak_rss_mib']:.0f}"])
    return "\n".join([
        "time to the first step and peak RSS (benchmarks/first_step.py)",
        "",
        *(f"- {k}: {v}" for k, v in context.items()),
        "",
        format_table(headers, rows, args.markdown),
        "",
        "arms: " + "; ".join(f"{n} = {ARM_TITLES[n]}" for n in ARMS) + ".",
        f"median of {args.trials} fresh processes per arm. first step = model build + "
        "optimizer/Trainer construction + one step, after imports; peak RSS = the process's "
        f"peak over its life (imports, build, {args.warmup} steps), from its ru_maxrss "
        "(benchmarks/_common.py); raw never imports cadence.",
    ])


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="fresh processes per arm (3)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="steps each process trains, the first one timed (20)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1)")
    parser.add_argument("--log-interval", type=int, default=10,
                        help="read/log the loss every N steps (10)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--size", choices=sorted(MODEL_SIZES), default="small",
                        help="the model of overhead.py --size (default small)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--quiet", action="store_true", help="no per-trial progress lines")
    parser.add_argument("--child", choices=ARMS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_minimums(parser, args, {"trials": 1, "threads": 1, "log_interval": 1, "warmup": 0})
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Measure and print the table (or, with ``--child``, be one trial). Returns 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child is not None:
        print(json.dumps(child(args.child, args.threads, args.warmup, args.seed,
                               args.log_interval, args.size)))
        return 0

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    load_before = loadavg()
    runs = measure(args, log)
    context = {
        "command": "python " + " ".join([os.path.relpath(os.path.abspath(__file__), REPO)]
                                        + argv),
        "model": f"overhead.py --size {args.size}: "
                 + ", ".join(f"{k}={v}" for k, v in MODEL_SIZES[args.size].items()),
        "machine": f"{os.cpu_count()} CPUs, torch.set_num_threads({args.threads})",
        "load average (1/5/15 min) before / after": f"{load_before} | {loadavg()}",
    }
    print(report(args, runs, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
