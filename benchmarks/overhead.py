"""How much time the cadence Trainer adds to a training step, on CPU (steady state).

Three arms (:mod:`_arms`: ``raw``, a plain PyTorch loop; ``trainer``, the Trainer as the
quickstart run file sets it up; ``bare``, the Trainer with everything optional off) train the
same ~0.93 M-parameter GPT-2 (``cadence.models.gpt.gpt2``: 2 layers, width 128, 4 heads,
vocabulary 4,096, 64 positions) on the same pre-generated random token batches (``[8, 64]``
``input_ids``, ``labels`` = a copy, as the Shakespeare loader yields them), with AdamW
(lr 1e-3), from the same seed.

Each arm keeps one model, optimizer (and Trainer) for the whole run; a round trains
``--steps`` more steps (the Trainer by raising ``state.max_duration`` and calling ``fit()``
again, each round a new epoch, so a round's time includes one
``FIT_START``/``EPOCH_START``/``FIT_END``). Every arm ends with bit-identical parameters
(reported), so all did the same arithmetic on the same batches in the same order. After
``--warmup`` steps per arm, ``--rounds`` rounds are interleaved in one process, the arm order
rotating every round (raw, trainer, bare; trainer, bare, raw; ...), so load from other
processes falls on every arm alike. Reported per arm: the median wall time per step over
rounds, its spread (25th-75th percentile), the ratio to ``raw`` (the median of the per-round
ratios, each round's arms having run back to back) and the same for process CPU time per step
(which leaves out time the process waited for a core).

The other overhead figures have scripts of their own: time to the first step and peak RSS
(``first_step.py``), what ``import cadence`` adds (``import_time.py``), a Hugging Face model in
a fresh process per run (``overhead_process.py``).

Usage::

    python benchmarks/overhead.py --markdown           # defaults: 40 rounds x 30 steps
    # the Trainer's own time per step, with a model that does no compute:
    python benchmarks/overhead.py --size null --markdown --rounds 40 --steps 300 --warmup 50
    python benchmarks/overhead.py --profile trainer    # cProfile one arm, top functions
    # this tree against another checkout (e.g. ``git worktree add /tmp/base <commit>``), in
    # alternating child processes, with Python calls per step:
    python benchmarks/overhead.py --size mlp --compare /tmp/base --repeats 6 --markdown

Many short rounds interleave the arms finely, which cancels a machine's changing load better
than a few long ones. Time on a 2-core CPU: about 4 minutes with the defaults (most of it the
small model's ~65 ms steps).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

if str(Path(__file__).resolve().parent) not in sys.path:  # _common, _arms: also via importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _arms import (  # noqa: E402
    ARM_TITLES,
    ARMS,
    BATCH_SIZE,
    LR,
    MODEL_SIZES,
    NUM_BATCHES,
    SEQ_LEN,
    RawArm,
    build_arm,
    make_batches,
    model_description,
    set_threads,
)
from _common import REPO, check_minimums, format_table, loadavg, quantile  # noqa: E402

__all__ = ["ArmResult", "steady_state", "profile_arm", "report", "parse_args", "main"]

#: Flags of the old all-in-one ``overhead.py`` and the script that took each benchmark.
MOVED_FLAGS = {
    "--startup-trials": "first_step.py --trials", "--import-trials": "import_time.py --trials",
    "--process-rounds": "overhead_process.py --rounds",
    "--process-steps": "overhead_process.py --steps",
    "--process-warmup": "overhead_process.py --warmup", "--process-only": "overhead_process.py",
}


@dataclass
class ArmResult:
    """Per-round seconds per step of one arm: wall and process CPU time."""

    name: str
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def steady_state(args: argparse.Namespace,
                 log: Callable[[str], None]) -> tuple[dict[str, ArmResult], float]:
    """Warm up every arm, then interleave ``args.rounds`` rounds of ``args.steps`` steps.

    Returns:
        The per-arm results, and the largest parameter difference between arms at the end.
    """
    set_threads(args.threads)
    model_kwargs = MODEL_SIZES[args.size]
    batches = make_batches(args.seed, model_kwargs)
    results = {name: ArmResult(name) for name in ARMS}
    with tempfile.TemporaryDirectory(prefix="cadence-overhead-") as folder:
        arms = {name: build_arm(name, args.seed, batches, args.log_interval, folder, model_kwargs)
                for name in ARMS}
        try:
            for name in ARMS:
                arms[name].run(args.warmup)
            for round_index in range(args.rounds):
                shift = round_index % len(ARMS)
                order = ARMS[shift:] + ARMS[:shift]
                for name in order:
                    gc.collect()
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    arms[name].run(args.steps)
                    wall1, cpu1 = time.perf_counter(), time.process_time()
                    results[name].wall.append((wall1 - wall0) / args.steps)
                    results[name].cpu.append((cpu1 - cpu0) / args.steps)
                log(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
                    f"{n} {results[n].wall[-1] * 1e3:.2f} ms" for n in ARMS))
            same = _max_param_difference(arms)
            log(f"max |parameter difference| between arms after training: {same:.3g}")
        finally:
            for arm in arms.values():
                arm.close()
    return results, same


def _parameters(arm: Any) -> list[Any]:
    if isinstance(arm, RawArm):
        return list(arm.model.parameters())
    return list(arm.trainer.state.model.model.parameters())  # the wrapped GPT2LMHeadModel


def _max_param_difference(arms: dict[str, Any]) -> float:
    """The largest elementwise difference between the raw arm's parameters and each other
    arm's (0.0: every arm did exactly the same arithmetic on the same batches)."""
    reference = _parameters(arms["raw"])
    worst = 0.0
    for arm in arms.values():
        for a, b in zip(reference, _parameters(arm)):
            worst = max(worst, float((a.detach() - b.detach()).abs().max()))
    return worst


def _profiled(name: str, args: argparse.Namespace, steps: int) -> Any:
    """cProfile ``steps`` steps of arm ``name`` (after ``args.warmup``); the stats."""
    import cProfile
    import pstats

    set_threads(args.threads)
    model_kwargs = MODEL_SIZES[args.size]
    batches = make_batches(args.seed, model_kwargs)
    with tempfile.TemporaryDirectory(prefix="cadence-overhead-") as folder:
        arm = build_arm(name, args.seed, batches, args.log_interval, folder, model_kwargs)
        arm.run(args.warmup)
        profiler = cProfile.Profile()
        profiler.enable()
        arm.run(steps)
        profiler.disable()
        arm.close()
    return pstats.Stats(profiler, stream=sys.stdout)


def calls_per_step(args: argparse.Namespace, steps: int = 100) -> dict[str, float]:
    """Python function calls per step of each arm (cProfile's count over ``steps`` steps,
    ``fit()``'s start and end included once: ``steps`` a multiple of ``args.log_interval``
    so every arm logs alike). Deterministic, unlike the times: the figure to compare
    two versions of the loop by."""
    return {name: _profiled(name, args, steps).total_calls / steps for name in ARMS}


def profile_arm(args: argparse.Namespace) -> None:
    """cProfile ``args.steps`` steps of one arm (after warmup); print the top functions."""
    stats = _profiled(args.profile, args, args.steps)
    print(f"{stats.total_calls / args.steps:.1f} Python calls per step")
    stats.sort_stats("tottime").print_stats(35)


def report(args: argparse.Namespace, results: dict[str, ArmResult],
           context: dict[str, str]) -> str:
    """The table: per arm, ms/step with its spread, the ratios to ``raw``, CPU time."""
    raw = results["raw"]
    headers = ["arm", "ms/step (median)", "p25-p75", "ratio to raw", "ratio p25-p75",
               "extra us/step", "CPU ms/step", "CPU ratio"]
    rows = []
    for name in ARMS:
        r = results[name]
        ratios = [w / b for w, b in zip(r.wall, raw.wall)]
        cpu_ratios = [c / b for c, b in zip(r.cpu, raw.cpu)]
        extra = [w - b for w, b in zip(r.wall, raw.wall)]
        rows.append([
            name,
            f"{statistics.median(r.wall) * 1e3:.3f}",
            f"{quantile(r.wall, .25) * 1e3:.2f}-{quantile(r.wall, .75) * 1e3:.2f}",
            f"{statistics.median(ratios):.4f}",
            f"{quantile(ratios, .25):.3f}-{quantile(ratios, .75):.3f}",
            f"{statistics.median(extra) * 1e6:+.0f}",
            f"{statistics.median(r.cpu) * 1e3:.3f}",
            f"{statistics.median(cpu_ratios):.4f}",
        ])
    return "\n".join([
        "cadence Trainer overhead per step (benchmarks/overhead.py)",
        "",
        *(f"- {k}: {v}" for k, v in context.items()),
        "",
        format_table(headers, rows, args.markdown),
        "",
        "arms: " + "; ".join(f"{n} = {ARM_TITLES[n]}" for n in ARMS) + ".",
        "ratio = median over rounds of (arm's ms/step / raw's ms/step in the same round); "
        "extra us/step = median over rounds of (arm - raw) wall time per step; "
        "CPU = process CPU time (user+sys).",
    ])


def compare(args: argparse.Namespace, argv: list[str]) -> str:
    """This tree against ``args.compare`` (another checkout's root): ``args.repeats`` child
    processes of the benchmark per tree, alternating (base, this, base, ...), each its own
    interleaved rounds; per tree and arm the median over children of the per-round ratio
    medians, and the Python calls per step (cProfile). Returns the table."""
    import json
    import subprocess

    from _common import child_env

    trees = {"base": os.path.abspath(args.compare), "this": str(REPO)}
    child_argv = [a for a in argv if not a.startswith("--compare") and a != args.compare]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    load_before = loadavg()
    for repeat in range(args.repeats):
        order = list(trees) if repeat % 2 == 0 else list(trees)[::-1]
        for name in order:
            env = child_env()
            env["PYTHONPATH"] = trees[name] + os.pathsep + env.get("PYTHONPATH", "")
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), *child_argv, "--json", "--quiet",
                 "--cadence-root", trees[name]],
                check=True, capture_output=True, text=True, env=env, timeout=3600)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    headers = ["tree", "arm", "ms/step (median)", "ratio to raw", "ratio min-max",
               "CPU ratio", "Python calls/step"]
    rows = []
    for name in trees:
        for arm in ARMS:
            ratios = [statistics.median(w / b for w, b in zip(r["wall"][arm], r["wall"]["raw"]))
                      for r in runs[name]]
            cpu = [statistics.median(c / b for c, b in zip(r["cpu"][arm], r["cpu"]["raw"]))
                   for r in runs[name]]
            wall = [statistics.median(r["wall"][arm]) for r in runs[name]]
            rows.append([name, arm, f"{statistics.median(wall) * 1e3:.3f}",
                         f"{statistics.median(ratios):.3f}",
                         f"{min(ratios):.3f}-{max(ratios):.3f}",
                         f"{statistics.median(cpu):.3f}", f"{runs[name][0]['calls'][arm]:.0f}"])
    return "\n".join([
        "cadence Trainer overhead per step: this tree against a base (benchmarks/overhead.py)",
        "",
        f"- command: python benchmarks/overhead.py {' '.join(argv)}",
        f"- base: {trees['base']}; this: {trees['this']}",
        f"- model: {model_description(args.size, args.seed)}",
        f"- {args.repeats} child processes per tree, alternating; each {args.warmup} warmup "
        f"steps per arm, then {args.rounds} rounds x {args.steps} steps, arms interleaved",
        f"- load average (1/5/15 min) before / after: {load_before} | {loadavg()}",
        f"- largest |parameter difference| between arms: "
        f"{max(r['param_diff'] for rs in runs.values() for r in rs):.3g}",
        "",
        format_table(headers, rows, args.markdown),
        "",
        "ratio = median over children of (the child's median over rounds of arm / raw in "
        "the same round); ratio min-max: over children; Python calls/step: cProfile's count "
        f"over {args.calls_steps} steps, fit()'s start and end included (deterministic).",
    ])


def _context(args: argparse.Namespace, argv: list[str], load_before: str, load_after: str,
             cpu_share: Optional[float], param_diff: float) -> dict[str, str]:
    import torch

    context = {
        "command": "python " + " ".join([os.path.relpath(os.path.abspath(__file__), REPO)]
                                        + argv),
        "model": model_description(args.size, args.seed),
        "data": f"{NUM_BATCHES} random batches [{BATCH_SIZE}, {SEQ_LEN}] (input_ids, labels), "
                f"cycled; AdamW lr {LR}",
        "schedule": f"{args.warmup} warmup steps per arm, then {args.rounds} rounds x "
                    f"{args.steps} steps, arm order rotated each round; loss read every "
                    f"{args.log_interval} steps",
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"torch.set_num_threads({args.threads})",
        "load average (1/5/15 min) before / after": f"{load_before} | {load_after}",
        "same arithmetic": (f"largest |parameter difference| between arms after training: "
                            f"{param_diff:.3g} (0 = identical updates)"),
    }
    if cpu_share is not None:
        context["CPU share"] = (f"{cpu_share:.2f} (process CPU time / wall time in the timed "
                                f"rounds; {args.threads}.00 would mean never waiting for a "
                                f"core)")
    return context


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line; a flag of the old all-in-one script names the script that took it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds (default 40)")
    parser.add_argument("--steps", type=int, default=30, help="steps per arm per round (30)")
    parser.add_argument("--warmup", type=int, default=20, help="warmup steps per arm (20)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1)")
    parser.add_argument("--log-interval", type=int, default=10,
                        help="read/log the loss every N steps, as the Trainer's log_interval (10)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--size", choices=sorted(MODEL_SIZES), default="small",
                        help="small: the ~0.93 M-parameter benchmark model (default); tiny: "
                             "~20 k parameters; mlp: a tiny MLP (~17 k parameters, ~0.4 ms a "
                             "step); null: no model compute, to read the "
                             "overhead in microseconds")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    parser.add_argument("--profile", choices=ARMS, default=None,
                        help="cProfile --steps steps of one arm instead of benchmarking")
    parser.add_argument("--compare", default=None, metavar="DIR",
                        help="also run the benchmark on the cadence of another checkout DIR: "
                             "--repeats child processes each, alternating, and print both "
                             "(ratios to raw, Python calls per step)")
    parser.add_argument("--repeats", type=int, default=6,
                        help="child processes per tree with --compare (6)")
    parser.add_argument("--calls-steps", type=int, default=100,
                        help="steps cProfile counts the calls of, with --compare (100)")
    parser.add_argument("--cadence-root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    for flag in (argv or []):
        moved = MOVED_FLAGS.get(flag.split("=")[0])
        if moved is not None:
            parser.error(f"{flag.split('=')[0]} moved: use benchmarks/{moved}")
    args = parser.parse_args(argv)
    check_minimums(parser, args,
                   {"rounds": 1, "steps": 1, "threads": 1, "log_interval": 1, "warmup": 0})
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark (or ``--profile``) and print the table. Returns 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = str(REPO) if args.cadence_root is None else args.cadence_root
    if root not in sys.path:
        sys.path.insert(0, root)
    if args.profile is not None:
        profile_arm(args)
        return 0
    if args.compare is not None:
        print(compare(args, argv))
        return 0

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    load_before = loadavg()
    results, param_diff = steady_state(args, log)
    if args.json:
        import json

        print(json.dumps({"wall": {n: r.wall for n, r in results.items()},
                          "cpu": {n: r.cpu for n, r in results.items()},
                          "calls": calls_per_step(args, args.calls_steps),
                          "param_diff": param_diff}))
        return 0
    cpu_share = (sum(sum(r.cpu) for r in results.values())
                 / sum(sum(r.wall) for r in results.values()))
    print(report(args, results, _context(args, argv, load_before, loadavg(), cpu_share,
                                         param_diff)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
