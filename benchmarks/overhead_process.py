"""The Trainer's time per step with a Hugging Face model, a fresh process per run (CPU;
issue 15, item 5).

Each run is a new interpreter: a 1-layer ``GPT2LMHeadModel`` (n_embd 16, vocabulary 256, seq
32, batch 16, AdamW, fp32) built before anything else, a ``DataLoader`` over a map-style
dataset of dict samples, the loss read every step. Arms ``raw`` (a plain loop,
``shuffle=False``), ``bare`` (``HuggingFaceModel`` + ``Trainer(progress_bar=False)``, the
sampler ``cadence.dist.get_sampler(ds, shuffle=False)``, a callback reading ``state.loss``
at ``BATCH_END``) and ``logging`` (the same with the Trainer's default progress output), each
once a round in a new interpreter, the order rotating; per arm the median over runs of each
run's median time between batch ends, the per-round ratio to ``raw``, and the fastest run
(:func:`process_report`). All arms end at the same loss.

Usage::

    python benchmarks/overhead_process.py --rounds 12 --markdown   # ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

if str(Path(__file__).resolve().parent) not in sys.path:  # _common, _arms: also via importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _arms import LR, build_hf_model_plain, set_threads  # noqa: E402
from _common import REPO, check_minimums, child_env, format_table, loadavg, quantile  # noqa: E402

__all__ = ["PROCESS_ARMS", "PROCESS_MODEL", "PROCESS_BATCH_SIZE", "process_child",
           "process_rounds", "process_report", "parse_args", "main"]

# read every step (the Trainer arms: a callback reading ``state.loss`` at BATCH_END).
PROCESS_ARMS = ("raw", "bare", "logging")
_PROCESS_TITLES = {
    "raw": "plain PyTorch loop, DataLoader(shuffle=False), loss.item() every step",
    "bare": "HuggingFaceModel + Trainer(progress_bar=False), nothing optional",
    "logging": "HuggingFaceModel + Trainer defaults (progress_bar=True: plain lines to the "
               "stdout pipe every 10 batches)",
}
PROCESS_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "max_seq_len": 32}
PROCESS_BATCH_SIZE = 16


def process_child(arm: str, threads: int, warmup: int, steps: int,
                  seed: int) -> dict[str, Any]:
    """One whole-process run of ``arm``: ``warmup + steps`` steps, one epoch.

    Returns:
        ``wall_ms`` / ``cpu_ms``: medians over the timed steps of the wall and process CPU
        time between consecutive batch ends (milliseconds); ``final_loss``: the last step's
        loss (equal in every arm: the same arithmetic).
    """
    set_threads(threads)
    import torch

    kwargs = PROCESS_MODEL
    samples = (warmup + steps) * PROCESS_BATCH_SIZE
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, kwargs["vocab_size"], (samples, kwargs["max_seq_len"]),
                        generator=generator)

    class TokenDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return samples

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[index], "labels": ids[index]}

    dataset = TokenDataset()
    model = build_hf_model_plain(seed, kwargs)  # before the Trainer, as a user does
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    stamps: list[tuple[float, float]] = []
    losses: list[float] = []
    if arm == "raw":
        loader = torch.utils.data.DataLoader(dataset, batch_size=PROCESS_BATCH_SIZE,
                                             shuffle=False)
        model.train()
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            stamps.append((time.perf_counter(), time.process_time()))
    else:
        import cadence.dist
        from cadence import Callback, Trainer
        from cadence.models.huggingface import HuggingFaceModel

        class ReadLoss(Callback):
            def batch_end(self, state: Any, logger: Any) -> None:
                losses.append(state.loss.item())
                stamps.append((time.perf_counter(), time.process_time()))

        sampler = cadence.dist.get_sampler(dataset, shuffle=False)
        loader = torch.utils.data.DataLoader(dataset, batch_size=PROCESS_BATCH_SIZE,
                                             sampler=sampler)
        trainer = Trainer(model=HuggingFaceModel(model), train_dataloader=loader,
                          max_duration="1ep", optimizers=optimizer, callbacks=[ReadLoss()],
                          progress_bar=arm == "logging", device="cpu", seed=seed)
        trainer.fit()
        trainer.close()
    timed = stamps[warmup:] if warmup > 0 else stamps
    wall = [b[0] - a[0] for a, b in zip(timed, timed[1:])]
    cpu = [b[1] - a[1] for a, b in zip(timed, timed[1:])]
    return {"wall_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
            "final_loss": losses[-1], "steps": len(losses)}


def process_rounds(args: argparse.Namespace,
                   log: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    """``args.rounds`` rounds; each round runs every arm of :data:`PROCESS_ARMS` once
    in a fresh interpreter, the arm order rotating every round."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PROCESS_ARMS}
    for round_index in range(args.rounds):
        shift = round_index % len(PROCESS_ARMS)
        for name in PROCESS_ARMS[shift:] + PROCESS_ARMS[:shift]:
            command = [sys.executable, os.path.abspath(__file__), "--child", name,
                       "--threads", str(args.threads), "--seed", str(args.seed),
                       "--warmup", str(args.warmup),
                       "--steps", str(args.steps)]
            out = subprocess.run(command, check=True, capture_output=True, text=True,
                                 cwd=REPO, env=child_env(), timeout=600)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        log(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
            f"{n} {runs[n][-1]['wall_ms']:.2f} ms" for n in PROCESS_ARMS))
    return runs


def process_report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    """The table of :func:`process_rounds`: per arm, the median over runs of each run's
    median step, its spread, and the median of the per-round ratios to ``raw``."""
    raw = runs["raw"]
    headers = ["arm", "ms/step (median)", "p25-p75", "ratio to raw", "ratio p25-p75",
               "extra us/step", "best run ms/step", "best-run ratio", "CPU ms/step",
               "CPU ratio", "final loss"]
    best_raw = min(r["wall_ms"] for r in raw)
    rows = []
    for name in PROCESS_ARMS:
        wall = [r["wall_ms"] for r in runs[name]]
        cpu = [r["cpu_ms"] for r in runs[name]]
        ratios = [w / b["wall_ms"] for w, b in zip(wall, raw)]
        cpu_ratios = [c / b["cpu_ms"] for c, b in zip(cpu, raw)]
        extra = [(w - b["wall_ms"]) * 1e3 for w, b in zip(wall, raw)]
        finals = sorted({f"{r['final_loss']:.6f}" for r in runs[name]})
        rows.append([
            name, f"{statistics.median(wall):.3f}",
            f"{quantile(wall, .25):.2f}-{quantile(wall, .75):.2f}",
            f"{statistics.median(ratios):.3f}",
            f"{quantile(ratios, .25):.3f}-{quantile(ratios, .75):.3f}",
            f"{statistics.median(extra):+.0f}", f"{min(wall):.3f}",
            f"{min(wall) / best_raw:.3f}", f"{statistics.median(cpu):.3f}",
            f"{statistics.median(cpu_ratios):.3f}", ", ".join(finals),
        ])
    model = ", ".join(f"{k}={v}" for k, v in PROCESS_MODEL.items())
    return "\n".join([
        "Hugging Face model, fresh process per run (issue 15, item 5)",
        "",
        f"- model: GPT2LMHeadModel({model}), fp32, batch {PROCESS_BATCH_SIZE}, AdamW lr {LR}, "
        f"torch.set_num_threads({args.threads})",
        f"- schedule: {args.rounds} rounds, each arm once a round in a fresh process "
        f"(order rotated); per run {args.warmup} warmup + {args.steps} timed "
        "steps, one epoch",
        "",
        format_table(headers, rows, args.markdown),
        "",
        "arms: " + "; ".join(f"{n} = {_PROCESS_TITLES[n]}" for n in PROCESS_ARMS) + ".",
        "ms/step = median over runs of the run's median time between consecutive batch ends; "
        "ratio = median over rounds of (arm / raw in the same round); best run = the fastest "
        "run's ms/step (the least disturbed by other processes; best-run ratio = arm's best / "
        "raw's best); CPU = process CPU time (it leaves out waiting for a core, but not a "
        "core slowed by other work on the host: shared caches, a vCPU's physical core); "
        "final loss = every run's last-step loss "
        "(one value per arm and the same in every arm: identical arithmetic).",
    ])


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8,
                        help="rounds; each runs every arm once in a fresh process (8)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per run (60)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed steps at the start of each run (20)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    parser.add_argument("--child", choices=PROCESS_ARMS, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_minimums(parser, args, {"rounds": 1, "steps": 1, "threads": 1, "warmup": 0})
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Run the rounds and print the table (or, with ``--child``, be one run). Returns 0."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child is not None:
        print(json.dumps(process_child(args.child, args.threads, args.warmup, args.steps,
                                       args.seed)))
        return 0

    def log(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    load_before = loadavg()
    runs = process_rounds(args, log)
    print(process_report(args, runs))
    print(f"\n- command: python {os.path.relpath(os.path.abspath(__file__), REPO)} "
          f"{' '.join(argv)}".rstrip())
    print(f"load average (1/5/15 min) before / after: {load_before} | {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
