"""GPT-2 124M training throughput and MFU on one GPU: eager vs compiled, with and without FSDP2.

Each configuration trains ``cadence.models.gpt.gpt2()`` (GPT-2 small: 12 layers, width 768,
12 heads, 1,024 positions, vocabulary 50,257, tied embeddings) with the cadence Trainer at
``precision="amp_bf16"`` on random token batches ``[batch, seq]``, AdamW (lr 6e-4), in its
own fresh process (clean peak-memory figures and dynamo caches):

``eager``          the model as built.
``compile``        per-block ``torch.compile``
                   (:func:`cadence.trainer.parallel.compile.apply_compile` with
                   ``per_block: true``, inductor, mode ``default``).
``fsdp``           FSDP2 on a world of one (``parallelism_config={"fsdp": {}}``:
                   FULL_SHARD, mixed precision DEFAULT, one unit per block + the root).
``fsdp+compile``   both, in torchtitan's order (compile, then ``fully_shard``).

Reported: tokens/s over ``--steps`` steps after ``--warmup`` steps (the clock is read after
a ``torch.cuda.synchronize()`` at both ends, nowhere in between), time per step, MFU, peak
allocated memory, and the time to the end of the first step (which includes compilation).

MFU (model FLOPs utilisation) = achieved model FLOP/s / the device's dense bf16 peak.
Model FLOPs per token = ``6 * N + 12 * n_layer * n_embd * seq``: ``6N`` for the forward and
backward matmuls of the ``N`` parameters that take part in matmuls (all but the position
embedding; the tied token embedding counts once, as the output projection), plus the
attention score and value matmuls. Sources: Chowdhery et al. 2022, "PaLM", Appendix B
(``6N + 12LHQT``); nanoGPT's ``GPT.estimate_mfu`` (``karpathy/nanoGPT`` ``model.py``).
Activation recomputation is not counted (none is used here). Peaks (dense bf16, no
sparsity): H100 SXM and H200 989.4 TFLOP/s, H100 NVL 835, H100 PCIe 756, A100 312;
``--peak-tflops`` overrides.

Usage::

    python benchmarks/gpu_throughput.py                       # all four configurations
    python benchmarks/gpu_throughput.py --configs eager,compile --steps 100 --markdown

Without CUDA it prints a message and exits with status 0 (nothing is measured).
``--device cpu`` runs the same code on the CPU for checking the plumbing only (use a tiny
model: ``--n-layer 2 --n-embd 64 --n-head 2 --seq-len 32 --vocab-size 512 --precision fp32
--compile-backend aot_eager``); its MFU column is empty.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

__all__ = ["CONFIGS", "PEAK_BF16_TFLOPS", "flops_per_token", "matmul_params", "peak_tflops",
           "main"]

CONFIGS = ("eager", "compile", "fsdp", "fsdp+compile")

#: Dense bf16 tensor-core peaks in TFLOP/s (NVIDIA data sheets; no 2:4 sparsity), matched
#: against ``torch.cuda.get_device_name()`` in this order.
PEAK_BF16_TFLOPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H200",), 989.4),
    (("H100", "NVL"), 835.0),
    (("H100", "PCIE"), 756.0),
    (("H100",), 989.4),  # SXM ("NVIDIA H100 80GB HBM3")
    (("A100",), 312.0),
)

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peak_tflops(device_name: str) -> Optional[float]:
    """The dense bf16 peak of a GPU from its name, or None when unknown."""
    name = device_name.upper()
    for needles, peak in PEAK_BF16_TFLOPS:
        if all(needle in name for needle in needles):
            return peak
    return None


def matmul_params(total_params: int, max_seq_len: int, n_embd: int) -> int:
    """Parameters that take part in matmuls: all but the position embedding
    (``max_seq_len * n_embd``), as nanoGPT's ``get_num_params(non_embedding=True)``."""
    return total_params - max_seq_len * n_embd


def flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token: ``6 * n_params + 12 * n_layer * n_embd * seq_len`` (PaLM,
    Appendix B; nanoGPT ``estimate_mfu``)."""
    return 6.0 * n_params + 12.0 * n_layer * n_embd * seq_len


# ----------------------------------------------------------------------------- one run
def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.warmup + args.steps`` steps of one configuration; return its figures."""
    import torch

    from cadence import Callback, Trainer
    from cadence.models.gpt import gpt2
    from cadence.trainer.parallel.compile import apply_compile

    config = args.config
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = gpt2(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                 vocab_size=args.vocab_size, max_seq_len=args.seq_len)
    model.to(device)  # before the (fused) optimizer is built; the Trainer would do it too
    total_params = sum(p.numel() for p in model.parameters())

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab_size, (8, args.batch_size, args.seq_len),
                        generator=generator)
    pool = [{"input_ids": ids[i], "labels": ids[i]} for i in range(ids.shape[0])]
    total_steps = args.warmup + args.steps

    class Loader:  # total_steps batches, cycling over the pool
        def __len__(self) -> int:
            return total_steps

        def __iter__(self) -> Any:
            return (pool[i % len(pool)] for i in range(total_steps))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    marks: dict[str, float] = {}

    class Clock(Callback):
        """Reads the clock after synchronising, at three steps only."""

        def fit_start(self, state: Any, logger: Any) -> None:
            sync()
            marks["fit_start"] = time.perf_counter()

        def batch_end(self, state: Any, logger: Any) -> None:
            step = int(state.timestamp.batch)
            if step in (1, args.warmup, total_steps):
                sync()
                marks[f"step{step}"] = time.perf_counter()

    compile_config = ({"per_block": True, "backend": args.compile_backend}
                      if "compile" in config else None)
    parallelism_config = {"fsdp": {}} if "fsdp" in config else None
    t_build = time.perf_counter()
    # Compile is applied in place before the Trainer shards the model: the plan's order.
    apply_compile(model, compile_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                                  weight_decay=0.1, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = Trainer(
        model=model, train_dataloader=Loader(), max_duration=f"{total_steps}ba",
        optimizers=optimizer, precision=args.precision, device=args.device, seed=0,
        progress_bar=False, callbacks=[Clock()], log_interval=f"{max(1, args.steps)}ba",
        parallelism_config=parallelism_config,
    )
    trainer.fit()
    loss = float(trainer.state.total_loss) if trainer.state.total_loss is not None else None
    trainer.close()

    seconds = marks[f"step{total_steps}"] - marks[f"step{args.warmup}"]
    tokens = args.steps * args.batch_size * args.seq_len
    tokens_per_s = tokens / seconds
    fpt = flops_per_token(matmul_params(total_params, args.seq_len, args.n_embd), args.n_layer,
                          args.n_embd, args.seq_len)
    peak = args.peak_tflops
    if peak is None and device.type == "cuda":
        peak = peak_tflops(torch.cuda.get_device_name(device))
    return {
        "config": config,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "params": total_params,
        "tokens_per_s": tokens_per_s,
        "ms_per_step": seconds / args.steps * 1e3,
        "tflops": tokens_per_s * fpt / 1e12,
        "mfu": None if peak is None else tokens_per_s * fpt / (peak * 1e12),
        "peak_tflops": peak,
        "peak_mem_gib": (torch.cuda.max_memory_allocated(device) / 2**30
                         if device.type == "cuda" else None),
        "first_step_s": marks["step1"] - t_build,
        "loss": loss,
        "torch": torch.__version__,
    }


# ----------------------------------------------------------------------------- driver
def _child_command(args: argparse.Namespace, config: str) -> list[str]:
    command = [sys.executable, os.path.abspath(__file__), "--child", config]
    for name in ("steps", "warmup", "batch_size", "seq_len", "n_layer", "n_head", "n_embd",
                 "vocab_size", "precision", "device", "compile_backend"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.peak_tflops is not None:
        command += ["--peak-tflops", str(args.peak_tflops)]
    return command


def _table(rows: list[dict[str, Any]], markdown: bool) -> str:
    headers = ["config", "tokens/s", "ms/step", "TFLOP/s", "MFU", "peak mem GiB",
               "first step s", "loss"]
    cells = []
    for r in rows:
        if "error" in r:
            cells.append([r["config"], "failed: " + r["error"], "", "", "", "", "", ""])
            continue
        cells.append([
            r["config"], f"{r['tokens_per_s']:,.0f}", f"{r['ms_per_step']:.1f}",
            f"{r['tflops']:.1f}", "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
            "-" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.2f}",
            f"{r['first_step_s']:.1f}", "-" if r["loss"] is None else f"{r['loss']:.3f}",
        ])
    if markdown:
        lines = ["| " + " | ".join(headers) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    fmt = lambda row: "  ".join(  # noqa: E731
        v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated subset of {', '.join(CONFIGS)} (default: all)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps (50)")
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed steps first, compilation included (10)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step (8)")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence (1024)")
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--n-embd", type=int, default=768)
    parser.add_argument("--vocab-size", type=int, default=50257,
                        help="50257 (GPT-2); 50304, a multiple of 64, is faster")
    parser.add_argument("--precision", default="amp_bf16",
                        choices=("amp_bf16", "amp_fp16", "fp32"))
    parser.add_argument("--compile-backend", default="inductor",
                        help="dynamo backend for the compile configurations (inductor)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="device peak in TFLOP/s for MFU (default: from the device name)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu only to check the plumbing with a tiny model")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        parser.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    args.configs = configs
    for name in ("steps", "warmup", "batch_size", "seq_len", "n_layer", "n_head", "n_embd",
                 "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child is not None:
        args.config = args.child
        print(json.dumps(run_config(args)))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_throughput: CUDA is not available on this machine; nothing was measured. "
                  "Run it on a GPU (or with --device cpu and a tiny model to check the "
                  "plumbing).")
            return 0
    env = {**os.environ, "PYTHONPATH": _REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rows: list[dict[str, Any]] = []
    for config in args.configs:
        print(f"running {config} ...", file=sys.stderr, flush=True)
        result = subprocess.run(_child_command(args, config), capture_output=True, text=True,
                                cwd=_REPO, env=env)
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(result.stderr, file=sys.stderr)
            rows.append({"config": config, "error": tail[:200]})
            continue
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
    done = [r for r in rows if "error" not in r]
    header = ["GPT-2 throughput (benchmarks/gpu_throughput.py)", ""]
    if done:
        first = done[0]
        peak = first["peak_tflops"]
        header += [
            f"- command: python benchmarks/gpu_throughput.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            f"- device: {first['device']}; torch {first['torch']}; peak "
            + ("unknown (MFU not shown)" if peak is None else f"{peak:g} TFLOP/s dense bf16"),
            f"- model: gpt2(n_layer={args.n_layer}, n_head={args.n_head}, n_embd={args.n_embd}, "
            f"vocab_size={args.vocab_size}, max_seq_len={args.seq_len}), "
            f"{first['params'] / 1e6:.1f} M parameters; precision {args.precision}",
            f"- data: random tokens [{args.batch_size}, {args.seq_len}] "
            f"({args.batch_size * args.seq_len:,} tokens a step); {args.warmup} warmup + "
            f"{args.steps} timed steps; AdamW"
            + (" (fused)" if args.device == "cuda" else ""),
            f"- FLOPs/token = 6N + 12 * n_layer * n_embd * seq (PaLM App. B; nanoGPT)",
            "",
        ]
    print("\n".join(header + [_table(rows, args.markdown)]))
    return 0 if len(done) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
