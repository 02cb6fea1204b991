"""Full fine-tuning vs ChildTuning-D vs LoRA r=8 on MiniLM-L6 tweet sentiment, and the KJV
LoRA pipeline's perplexities.

**MiniLM** (``--part minilm``): the protocol of ``benchmarks/child_tuning.py`` (same splits,
epochs, AdamW with linear decay and 10 % warmup, clipping at norm 1.0, batch 16; the learning
rate of each method chosen on the dev split over ``--grid-seeds``, then ``--seeds`` paired seeds
on the test split), for three methods:

* ``full``: every weight trained (child_tuning.py's "vanilla");
* ``child_tuning_D``: ChildTuning-D, ``reserve_p`` 0.3, Fisher over the whole training set;
* ``lora``: ``peft`` LoRA (Hu et al. 2021) r=8, alpha 16, dropout 0.1 on the attention's
  ``query`` and ``value``; the new classifier head trains too (``task_type: SEQ_CLS``).

LoRA's grid is higher than the others' (``--lora-lrs``): adapters starting at zero want larger
steps (Hu et al. used 4e-4 to 5e-4 on RoBERTa-base with many more steps). Each run is a fresh
process, which reports: dev and test accuracy, trainable parameters, seconds per optimizer step
(the fit's wall time over its steps; D's Fisher pass included), peak RSS (the process's
``ru_maxrss`` after fit and evaluation, before the checkpoint is written) and the size of one
checkpoint written after fit (``full`` format, optimizer state included; LoRA adapter-only).

**KJV** (``--part kjv``): see ``benchmarks/_kjv_pipeline.py``.

::

    python benchmarks/peft_methods.py                                  # both parts (~60 min, 2 cores)
    python benchmarks/peft_methods.py --part minilm --cache runs/peft.jsonl
    python benchmarks/peft_methods.py --part kjv --kjv-dir runs/bench-kjv
    python benchmarks/peft_methods.py --part minilm --grid-seeds --seeds 1 --epochs 1  # quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Not named peft.py: the other scripts put this folder on sys.path (and processes spawned
# from one inherit it), where such a file would shadow the ``peft`` package.
sys.path.insert(0, str(ROOT))

# child_tuning sets the environment (offline hub, fixed thread counts) before torch loads
from benchmarks import _kjv_pipeline, child_tuning  # noqa: E402

LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
        "target_modules": ["query", "value"]}
#: method -> (child_tuning.py's method whose config it starts from, peft spec or None)
METHODS: dict[str, tuple[str, Any]] = {
    "full": ("vanilla", None),
    "child_tuning_D": ("D", None),
    "lora": ("vanilla", LORA),
}
T95 = child_tuning.T95


def run_config(args: argparse.Namespace, method: str, lr: float, seed: int) -> dict[str, Any]:
    """child_tuning.py's run file for the method, with LoRA's ``peft`` added."""
    base, peft = METHODS[method]
    cfg = child_tuning.run_config(args, base, lr, seed)
    cfg["run_name"] = f"peft_{method}_{lr:g}_{seed}"
    if peft is not None:
        cfg["model"]["peft"] = dict(peft)
    return cfg


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One run, in this (fresh) process: fit, evaluate, measure, write one checkpoint."""
    import torch
    import transformers

    from cadence.config.build import build_trainer
    from cadence.config.load import load_config

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    args = argparse.Namespace(**{k: v for k, v in spec["args"].items()})
    args.run_file = Path(args.run_file)
    held_out = child_tuning.held_out_batches(args)
    cfg = load_config(run_config(args, spec["method"], spec["lr"], spec["seed"]))
    with tempfile.TemporaryDirectory(prefix="cadence-peft-") as folder:
        trainer = build_trainer(cfg)
        start = time.perf_counter()
        trainer.fit()
        seconds = time.perf_counter() - start
        model = trainer.state.model
        steps = int(trainer.state.timestamp.batch)
        result = {
            "method": spec["method"], "lr": spec["lr"], "seed": spec["seed"],
            "dev": child_tuning.accuracy(model, held_out["dev"]),
            "test": child_tuning.accuracy(model, held_out["test"]),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "params": sum(p.numel() for p in model.parameters()),
            "seconds": seconds, "s_per_step": seconds / max(steps, 1),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "loss": float(trainer.state.total_loss), "threads": torch.get_num_threads(),
        }
        os.chdir(folder)  # save_checkpoint lands in the working directory without save_folder
        path = trainer.save_checkpoint("checkpoint")
        result["checkpoint_mib"] = os.path.getsize(path) / 2**20
        trainer.close()
    return result


def run_one(args: argparse.Namespace, method: str, lr: float, seed: int) -> dict[str, Any]:
    """One run in a fresh process (its peak RSS is its own), read back from --cache if there."""
    key = child_tuning.cache_key(args, method, lr, seed)
    cached = child_tuning.read_cached(args, key)
    if cached is not None:
        print(f"{method:>14} lr {lr:g} seed {seed}: cached", flush=True)
        return cached
    protocol = {k: v for k, v in vars(args).items() if k in child_tuning._PROTOCOL}
    spec = {"method": method, "lr": lr, "seed": seed,
            "args": {**protocol, "run_file": str(args.run_file)}}
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{method} lr {lr:g} seed {seed} failed ({done.returncode}):\n"
                         f"{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    child_tuning.write_cached(args, key, result)
    print(f"{method:>14} lr {lr:g} seed {seed}: dev {100 * result['dev']:.2f} %, test "
          f"{100 * result['test']:.2f} %, {result['s_per_step']:.3f} s/step, "
          f"{result['peak_rss_mib']:.0f} MiB peak, checkpoint {result['checkpoint_mib']:.2f} "
          f"MiB", flush=True)
    return result


def grid_of(args: argparse.Namespace, method: str) -> list[float]:
    return args.lora_lrs if method == "lora" else args.lrs


def grid_table(args: argparse.Namespace, grid: list[dict[str, Any]]) -> tuple[dict[str, float],
                                                                             str]:
    """Each method's learning rate with the best mean dev accuracy, and the grid lines."""
    chosen: dict[str, float] = {}
    lines = ["| method | mean dev accuracy by learning rate | chosen |", "|---|---|---|"]
    for method in args.methods:
        lrs = grid_of(args, method)
        means = {lr: statistics.mean(r["dev"] for r in grid
                                     if r["method"] == method and r["lr"] == lr) for lr in lrs}
        chosen[method] = max(lrs, key=lambda lr: means[lr])
        cells = ", ".join(f"{lr:g}: {100 * means[lr]:.1f} %" for lr in lrs)
        lines.append(f"| {method} | {cells} | {chosen[method]:g} |")
    return chosen, "\n".join(lines)


def summary(args: argparse.Namespace, final: list[dict[str, Any]]) -> str:
    """The per-method table and the paired differences, as Markdown."""
    by = {m: {r["seed"]: r for r in final if r["method"] == m} for m in args.methods}
    lines = ["| method | lr | test accuracy mean | std | min - max | trainable params | "
             "checkpoint MiB | s / step | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for method, runs in by.items():
        rows = list(runs.values())
        accs = [100 * r["test"] for r in rows]
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("s_per_step", "peak_rss_mib", "checkpoint_mib")}
        lines.append(
            f"| {method} | {rows[0]['lr']:g} | {statistics.mean(accs):.2f} % | {std:.2f} | "
            f"{min(accs):.2f} - {max(accs):.2f} | {rows[0]['trainable']:,} "
            f"({100 * rows[0]['trainable'] / rows[0]['params']:.2f} %) | "
            f"{med['checkpoint_mib']:.2f} | {med['s_per_step']:.3f} | {med['peak_rss_mib']:.0f} |")
    lines += ["", "| pair (a - b) | mean diff (points) | std of diffs | 95 % t interval | "
              "a wins / seeds |", "|---|---|---|---|---|"]
    for a, b in (("child_tuning_D", "full"), ("lora", "full"), ("lora", "child_tuning_D")):
        if a not in by or b not in by:
            continue
        seeds = sorted(set(by[a]) & set(by[b]))
        diffs = [100 * (by[a][s]["test"] - by[b][s]["test"]) for s in seeds]
        if not diffs:
            continue
        mean = statistics.mean(diffs)
        std = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
        half = T95.get(len(diffs) - 1, 1.96) * std / math.sqrt(len(diffs))
        lines.append(f"| {a} - {b} | {mean:+.2f} | {std:.2f} | [{mean - half:+.2f}, "
                     f"{mean + half:+.2f}] | {sum(d > 0 for d in diffs)} / {len(diffs)} |")
    return "\n".join(lines)


def minilm(args: argparse.Namespace) -> str:
    total = time.perf_counter()
    grid: list[dict[str, Any]] = []
    chosen = {m: grid_of(args, m)[0] for m in args.methods}
    table = "(no grid)"
    if args.grid_seeds:
        for seed in args.grid_seeds:
            for method in args.methods:
                if len(grid_of(args, method)) > 1:
                    grid += [run_one(args, method, lr, seed) for lr in grid_of(args, method)]
        searched = [m for m in args.methods if len(grid_of(args, m)) > 1]
        if searched:
            picked, table = grid_table(argparse.Namespace(**{**vars(args),
                                                             "methods": searched}), grid)
            chosen.update(picked)
    final = [run_one(args, method, chosen[method], seed)
             for seed in args.seeds for method in args.methods]
    return (f"MiniLM-L6, tweet sentiment: {args.epochs} epochs, train {args.num_train} / dev "
            f"{args.num_dev} / test {args.num_test}, grid seeds {args.grid_seeds}, seeds "
            f"{args.seeds}; {time.perf_counter() - total:.0f} s in all\n\n"
            f"Mean dev accuracy on the learning-rate grid:\n\n{table}\n\n"
            f"Test accuracy at each method's chosen learning rate, paired seeds (per-run "
            f"figures are medians over the seeds):\n\n{summary(args, final)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["both", "minilm", "kjv"], default="both")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--run-file", type=Path, default=ROOT / "yamls/finetune_child_tuning.yaml")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lrs", type=float, nargs="+", default=[2e-4, 4e-4, 8e-4],
                        help="grid of full and child_tuning_D (child_tuning.py chose 4e-4 "
                             "for both on its wider grid)")
    parser.add_argument("--lora-lrs", type=float, nargs="+",
                        default=[8e-4, 1.6e-3, 3.2e-3, 6.4e-3, 1.28e-2], help="LoRA's grid")
    parser.add_argument("--grid-seeds", type=int, nargs="*", default=[101])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-dev", type=int, default=500)
    parser.add_argument("--num-test", type=int, default=1200)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--data-seed", type=int, default=17)
    parser.add_argument("--cache", type=Path, default=None,
                        help="JSON lines of finished runs, reused on a rerun")
    _kjv_pipeline.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    out = []
    if args.part in ("both", "minilm"):
        out.append(minilm(args))
    if args.part in ("both", "kjv"):
        out.append(_kjv_pipeline.main(args))
    print("\n\n" + "\n\n".join(out))


if __name__ == "__main__":
    main()
