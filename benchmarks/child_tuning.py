"""Child-tuning vs vanilla fine-tuning: MiniLM-L6 on 3-class tweet sentiment, several seeds.

Runs ``yamls/finetune_child_tuning.yaml`` once per method and seed, each in this process,
and prints the final validation accuracy of every run and a markdown table of the mean,
the sample standard deviation and the range per method::

    python benchmarks/child_tuning.py                        # vanilla, F, D x seeds 1 2 3
    python benchmarks/child_tuning.py --seeds 1 2 3 4 5 --override variables.num_train=512

Methods: ``vanilla`` (``algorithms=null``), ``F`` (``algorithms.child_tuning.mode=F``), ``D``
(the run file's ChildTuning-D). A seed changes the head's initialisation, dropout and the
data order; every run trains and validates on the same tweets. The paper (Xu et al., EMNLP
2021, Table 1) reports D >= F >= vanilla on small GLUE tasks with BERT-large and a few
epochs; this run is far smaller (256 tweets, one epoch, a 22.7 M-parameter model), so read
the spread before the means.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Fixed thread counts: MKL/OpenMP otherwise use fewer threads on a loaded machine, which
# changes float summation order, and 16 fine-tuning steps amplify that into a different run.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
os.environ.setdefault("OMP_DYNAMIC", "FALSE")

METHODS = {
    "vanilla": ["algorithms=null"],
    "F": ["algorithms.child_tuning.mode=F"],
    "D": ["algorithms.child_tuning.mode=D"],
}


def run_one(run_file: Path, overrides: list[str]) -> dict[str, Any]:
    """Build and fit one run; its final validation accuracy, loss and wall time."""
    from cadence.trainer.build import build_trainer
    from cadence.trainer.config import load_config

    cfg = load_config(run_file, [*overrides, "progress_bar=false", "save_folder=null"])
    start = time.perf_counter()
    trainer = build_trainer(cfg)
    trainer.fit()
    seconds = time.perf_counter() - start
    metrics = trainer.state.eval_metrics["eval"]
    accuracy = float(metrics["MulticlassAccuracy"].compute())
    loss = float(trainer.state.total_loss) if trainer.state.total_loss is not None else float("nan")
    trainer.close()
    return {"accuracy": accuracy, "last_train_loss": loss, "seconds": seconds}


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """A markdown table: one row per method."""
    lines = ["| method | val accuracy mean | std (n-1) | min | max | runs | s / run |",
             "|---|---|---|---|---|---|---|"]
    for method, runs in results.items():
        accs = [r["accuracy"] for r in runs]
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        secs = statistics.mean(r["seconds"] for r in runs)
        lines.append(f"| {method} | {100 * statistics.mean(accs):.2f} % | {100 * std:.2f} | "
                     f"{100 * min(accs):.2f} | {100 * max(accs):.2f} | {len(accs)} | "
                     f"{secs:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-file", type=Path, default=ROOT / "yamls/finetune_child_tuning.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--override", action="append", default=[],
                        help="a key=value override for every run (repeatable)")
    args = parser.parse_args(argv)

    import transformers

    transformers.logging.set_verbosity_error()  # the new head's "MISSING" report, every run
    transformers.logging.disable_progress_bar()  # "Loading weights" bars
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
    total = time.perf_counter()
    for seed in args.seeds:  # seeds outermost: an interrupted run still compares methods
        for method in args.methods:
            result = run_one(args.run_file, [*args.override, *METHODS[method], f"seed={seed}"])
            results[method].append(result)
            print(f"{method:>7} seed {seed}: val accuracy {100 * result['accuracy']:.2f} %, "
                  f"last train loss {result['last_train_loss']:.3f}, {result['seconds']:.0f} s",
                  flush=True)
    overrides = " ".join(args.override) or "none"
    print(f"\n{args.run_file.name}, seeds {args.seeds}, overrides: {overrides}; "
          f"{time.perf_counter() - total:.0f} s in all\n")
    print(table(results))


if __name__ == "__main__":
    main()
