"""GPT-2 124M training throughput and MFU on one GPU: eager vs compiled, with and without FSDP2.

Each configuration trains ``cadence.models.gpt.gpt2()`` (GPT-2 small: 12 layers, width 768,
12 heads, 1,024 positions, vocabulary 50,257, tied embeddings) with the cadence Trainer at
``precision="amp_bf16"`` on random token batches ``[batch, seq]``, AdamW (lr 6e-4), in its
own fresh process (clean peak-memory figures and dynamo caches):

``eager``          the model as built.
``compile``        per-block ``torch.compile``
                   (:func:`cadence.parallel.compile.apply_compile` with
                   ``per_block: true``, inductor, mode ``default``).
``fsdp``           FSDP2 on a world of one (``parallelism_config={"fsdp": {}}``:
                   FULL_SHARD, mixed precision DEFAULT, one unit per block + the root).
``fsdp+compile``   both, in torchtitan's order (compile, then ``fully_shard``).
``tp``             tensor parallelism over ``--tp-degree`` GPUs (default 2; torchrun, one
                   process per GPU; ``parallelism_config={"tp": {"tensor_parallel_degree":
                   N}}``, the built-in GPT-2 plan). Every rank of the group trains on the
                   same batch; tokens/s is the group's, MFU is against N GPUs' peak. Skipped
                   (a row says why) on a machine with fewer GPUs.

Reported: tokens/s over ``--steps`` steps after ``--warmup`` steps (the clock is read after
a ``torch.cuda.synchronize()`` at both ends, nowhere in between), time per step, MFU, peak
allocated memory, and the time to the end of the first step (which includes compilation).

MFU (model FLOPs utilisation) = achieved model FLOP/s / the device's dense peak at the
run's precision. Model FLOPs per token = ``6 * N + 12 * n_layer * n_embd * seq``: ``6N`` for
the forward and backward matmuls of the ``N`` parameters that take part in matmuls (all but
the position embedding; the tied token embedding counts once, as the output projection),
plus the attention score and value matmuls. Sources: Chowdhery et al. 2022, "PaLM",
Appendix B (``6N + 12LHQT``); nanoGPT's ``GPT.estimate_mfu`` (``karpathy/nanoGPT``
``model.py``). It is the count ``HuggingFaceModel.flops_per_batch`` gives and
``SpeedMonitor`` logs MFU with (:func:`cadence.utils.flops.transformer_flops_per_token`).
Activation recomputation is not counted (none is used here). Peaks come from cadence's
table, :data:`cadence.utils.flops.PEAK_FLOPS` (dense, no sparsity; bf16: H100 SXM and H200
989.4 TFLOP/s, H100 NVL 835.5, H100 PCIe 756, A100 312, ...); ``--peak-tflops`` overrides.

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

__all__ = ["CONFIGS", "flops_per_token", "matmul_params", "peak_tflops",
           "main"]

CONFIGS = ("eager", "compile", "fsdp", "fsdp+compile", "tp")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peak_tflops(device_name: str, precision: str = "bf16") -> Optional[float]:
    """The dense peak of a GPU in TFLOP/s from its name (cadence's table,
    :func:`cadence.utils.flops.peak_flops`), or None when unknown."""
    from cadence.utils.flops import peak_flops

    peak = peak_flops(device_name, precision)
    return None if peak is None else round(peak / 1e12, 3)


def matmul_params(total_params: int, max_seq_len: int, n_embd: int) -> int:
    """Parameters that take part in matmuls: all but the position embedding
    (``max_seq_len * n_embd``), as nanoGPT's ``get_num_params(non_embedding=True)``."""
    return total_params - max_seq_len * n_embd


def flops_per_token(n_params: int, n_layer: int, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token: ``6 * n_params + 12 * n_layer * n_embd * seq_len`` (PaLM,
    Appendix B; nanoGPT ``estimate_mfu``), :func:`cadence.utils.flops.transformer_flops_per_token`
    with one head of width ``n_embd`` (the attention term depends only on ``H * Q``)."""
    from cadence.utils.flops import transformer_flops_per_token

    return transformer_flops_per_token(n_params, n_layer, 1, n_embd, seq_len)


# ----------------------------------------------------------------------------- one run
def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``args.warmup + args.steps`` steps of one configuration; return its figures."""
    import torch

    from cadence import Callback, Trainer
    from cadence.models.gpt import gpt2
    from cadence.parallel.compile import apply_compile

    config = args.config
    device = torch.device(args.device)
    if device.type == "cuda" and "LOCAL_RANK" in os.environ:  # a torchrun group (tp)
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
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
    # Model FLOPs per token: the PaLM count SpeedMonitor uses (HuggingFaceModel.flops_per_batch,
    # equal to flops_per_token(matmul_params(...)) below), read before compile or sharding.
    fpt = model.flops_per_batch(pool[0]) / (args.batch_size * args.seq_len)

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
    gpus = args.tp_degree if config == "tp" else 1
    if config == "tp":
        parallelism_config = {"tp": {"tensor_parallel_degree": args.tp_degree}}
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
    peak = args.peak_tflops
    if peak is None and device.type == "cuda":
        from cadence.utils.flops import device_peak_flops

        flops = device_peak_flops(device, args.precision)  # fp32: tf32 if PyTorch allows it
        peak = None if flops is None else flops / 1e12
    return {
        "config": config,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "params": total_params,
        "tokens_per_s": tokens_per_s,
        "ms_per_step": seconds / args.steps * 1e3,
        "tflops": tokens_per_s * fpt / 1e12,
        "mfu": None if peak is None else tokens_per_s * fpt / (gpus * peak * 1e12),
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
    if config == "tp":  # one process per GPU of the tensor-parallel group
        command[1:1] = ["-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={args.tp_degree}"]
    for name in ("steps", "warmup", "batch_size", "seq_len", "n_layer", "n_head", "n_embd",
                 "vocab_size", "precision", "device", "compile_backend", "tp_degree"):
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
    parser.add_argument("--tp-degree", type=int, default=2,
                        help="GPUs of the tp configuration's tensor-parallel group (2)")
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
        result = run_config(args)
        if int(os.environ.get("RANK", "0")) == 0:  # one line from a torchrun group
            print(json.dumps(result))
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
        if config == "tp" and args.device == "cuda":
            import torch

            if torch.cuda.device_count() < args.tp_degree:
                rows.append({"config": config, "error": f"needs {args.tp_degree} GPUs, found "
                                                        f"{torch.cuda.device_count()}"})
                continue
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
            "- command: python benchmarks/gpu_throughput.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            f"- device: {first['device']}; torch {first['torch']}; peak "
            + ("unknown (MFU not shown)" if peak is None
               else f"{peak:g} TFLOP/s dense {args.precision}"),
            f"- model: gpt2(n_layer={args.n_layer}, n_head={args.n_head}, n_embd={args.n_embd}, "
            f"vocab_size={args.vocab_size}, max_seq_len={args.seq_len}), "
            f"{first['params'] / 1e6:.1f} M parameters; precision {args.precision}",
            f"- data: random tokens [{args.batch_size}, {args.seq_len}] "
            f"({args.batch_size * args.seq_len:,} tokens a step); {args.warmup} warmup + "
            f"{args.steps} timed steps; AdamW"
            + (" (fused)" if args.device == "cuda" else ""),
            "- FLOPs/token = 6N + 12 * n_layer * n_embd * seq (PaLM App. B; nanoGPT)",
            "",
        ]
    print("\n".join(header + [_table(rows, args.markdown)]))
    return 0 if len(done) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
