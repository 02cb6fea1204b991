"""Language-model algorithms against the baseline at an equal wall-clock budget.

The quickstart GPT-2 (``yamls/quickstart.yaml``: 4 layers, width 192, 4096-token BPE,
sequences of 128, batch 16, AdamW with cosine decay, gradient clipping) on Shakespeare,
trained once per method and seed for the same number of *seconds* (``--budget-s``; a
callback stops training when the budget is spent, so a method that makes steps cheaper
takes more of them), then scored on the same held-out validation batches:

* **val ppl**: ``exp`` of the mean next-token cross entropy on ``--eval-batches`` batches of
  32 validation sequences (true labels, no smoothing, full length 128);
* **tokens/s**: tokens trained on (the timestamp's count, which follows truncated and
  pruned batches) per second of training;
* **steps**: optimizer steps taken within the budget.

Each figure is the median over ``--seeds`` (default 3). Methods (Composer's defaults where
they apply, scaled to 128-token sequences; none is tuned):

* ``seq_length_warmup``: 8 -> 128 tokens in steps of 8 over the first 30 % of training;
* ``label_smoothing``: 0.1;
* ``alibi``: ALiBi attention biases, training rows of 0.25 x 128 = 32 tokens (Composer's
  ``train_sequence_length_scaling``), evaluated at 128;
* ``selective_backprop``: keep 50 % of the samples of every other batch between 50 % and
  90 % of training;
* ``stacked``: all four.

The schedules (warm-up, cosine decay, the algorithms' fractions) are laid out over
``--max-batches``, which also caps a run; keep it above the steps the budget allows, or a
fast method stops before its budget is spent (the table's ``steps`` shows it). Runs are
interleaved (seed by seed, the method order rotated) so a change of load hits them alike.

    python benchmarks/algorithms.py                     # ~8 min on 2 cores
    python benchmarks/algorithms.py --budget-s 240 --max-batches 400 --threads 2  # alone

Run it alone: other processes on the machine change tokens/s (the load average is
printed).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread by default: on a loaded 2-core machine two spinning OpenMP threads per process
# made a step 6-8x slower (10-15 s instead of 1.7 s at load average 11); --threads 2 alone.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from _common import format_table, loadavg  # noqa: E402

SEQ = 128
LM_KEYS = {"input_key": "input_ids", "target_key": "labels"}
ALGORITHMS: dict[str, dict[str, Any]] = {
    "seq_length_warmup": {"duration": 0.3, "min_seq_length": 8, "max_seq_length": SEQ,
                          "step_size": 8},
    "label_smoothing": {"smoothing": 0.1, "target_key": "labels"},
    "alibi": {"max_sequence_length": SEQ, "train_sequence_length_scaling": 0.25},
    "selective_backprop": {"start": 0.5, "end": 0.9, "keep": 0.5, "interrupt": 2, **LM_KEYS},
}
METHODS: dict[str, list[str]] = {
    "baseline": [],
    **{name: [name] for name in ALGORITHMS},
    "stacked": list(ALGORITHMS),
}


def run_config(args: argparse.Namespace, method: str, seed: int) -> dict[str, Any]:
    """The quickstart run file with this benchmark's changes, as a plain mapping."""
    import yaml

    cfg = yaml.safe_load((ROOT / "yamls" / "quickstart.yaml").read_text())
    cfg.update(seed=seed, max_duration=f"{args.max_batches}ba", eval_loader=None,
               progress_bar=False, save_folder=None, run_name=f"algorithms_{method}_{seed}",
               log_interval=f"{10 * args.max_batches}ba", loggers={}, callbacks={})
    cfg.pop("eval_interval", None)
    cfg.pop("eval_subset_num_batches", None)
    cfg["scheduler"]["t_warmup"] = f"{max(1, args.max_batches // 7)}ba"  # quickstart: 50/360
    algorithms = dict(cfg.get("algorithms") or {})  # the quickstart's gradient clipping
    for name in METHODS[method]:
        algorithms[name] = ALGORITHMS[name]
    cfg["algorithms"] = algorithms
    return cfg


def val_batches(count: int) -> list[dict[str, Any]]:
    """The first ``count`` batches of 32 validation sequences (fixed order)."""
    from cadence.data import shakespeare_dataloader

    loader = shakespeare_dataloader(split="val", seq_len=SEQ, batch_size=32, shuffle=False,
                                    vocab_size=4096)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == count:
            break
    return batches


def perplexity(model: Any, batches: list[dict[str, Any]]) -> float:
    """``exp`` of the mean next-token cross entropy over ``batches``, in eval mode."""
    import torch

    model.eval()
    with torch.no_grad():
        losses = [float(model.loss(model(batch), batch)) for batch in batches]
    return math.exp(sum(losses) / len(losses))


def run_one(args: argparse.Namespace, method: str, seed: int,
            held_out: list[dict[str, Any]]) -> dict[str, float]:
    """Train ``method`` for ``--budget-s`` seconds; its val perplexity, tokens/s and steps."""
    from cadence import Callback
    from cadence.config.build import build_trainer
    from cadence.config.load import load_config

    class Budget(Callback):
        """Stops training once ``budget`` seconds have passed since FIT_START."""

        def __init__(self, budget: float) -> None:
            self.budget, self.start, self.seconds = budget, 0.0, 0.0

        def fit_start(self, state: Any, logger: Any) -> None:
            self.start = time.perf_counter()

        def batch_end(self, state: Any, logger: Any) -> None:
            self.seconds = time.perf_counter() - self.start
            if self.seconds >= self.budget:
                state.stop_training = True

    trainer = build_trainer(load_config(run_config(args, method, seed)))
    budget = Budget(args.budget_s)
    trainer.state.callbacks.append(budget)
    trainer.engine.refresh()  # the engine's per-event tables now include the budget
    trainer.fit()
    timestamp = trainer.state.timestamp
    result = {"ppl": perplexity(trainer.state.model, held_out),
              "tokens_s": int(timestamp.token) / max(budget.seconds, 1e-9),
              "steps": float(int(timestamp.batch))}
    trainer.close()
    print(f"{method:>18} seed {seed}: val ppl {result['ppl']:.1f}, "
          f"{result['tokens_s']:.0f} tokens/s, {int(result['steps'])} steps", flush=True)
    return result


def table(results: dict[str, list[dict[str, float]]], markdown: bool) -> str:
    base: Optional[float] = None
    rows = []
    for method, runs in results.items():
        ppl = statistics.median(r["ppl"] for r in runs)
        base = ppl if method == "baseline" else base
        delta = "" if base is None or method == "baseline" else f"{100 * (ppl / base - 1):+.1f} %"
        rows.append([method, f"{ppl:.1f}", delta,
                     f"{statistics.median(r['tokens_s'] for r in runs):.0f}",
                     f"{statistics.median(r['steps'] for r in runs):.0f}",
                     " / ".join(f"{r['ppl']:.1f}" for r in runs)])
    return format_table(["method", "val ppl", "vs baseline", "tokens/s", "steps",
                         "ppl per seed"], rows, markdown)


def main(argv: Optional[list[str]] = None) -> dict[str, list[dict[str, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--budget-s", type=float, default=20.0,
                        help="training seconds per run (default 20)")
    parser.add_argument("--max-batches", type=int, default=30,
                        help="the schedules' length in batches, and the most a run takes "
                             "(default 30)")
    parser.add_argument("--eval-batches", type=int, default=4,
                        help="validation batches of 32 sequences (default 4)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.budget_s <= 0 or args.max_batches < 1 or args.eval_batches < 1:
        parser.error("--budget-s must be > 0, --max-batches and --eval-batches >= 1")
    import torch

    torch.set_num_threads(args.threads or int(os.environ["OMP_NUM_THREADS"]))
    print(f"load average before: {loadavg()}; {torch.get_num_threads()} torch thread(s)",
          flush=True)
    held_out = val_batches(args.eval_batches)
    # interleaved, seed by seed, the order rotated: a change of load hits every method alike
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.methods}
    for index, seed in enumerate(args.seeds):
        shift = index % len(args.methods)
        for method in args.methods[shift:] + args.methods[:shift]:
            results[method].append(run_one(args, method, seed, held_out))
    print(f"\nbudget {args.budget_s:g} s a run, schedules over {args.max_batches} batches, "
          f"median of {len(args.seeds)} seeds; load average after: {loadavg()}")
    print(table(results, args.markdown))
    return results


if __name__ == "__main__":
    main()
