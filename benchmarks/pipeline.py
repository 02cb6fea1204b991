"""Pipeline bubbles per schedule: the measured idle fraction of each rank's step beside the
theory (p - 1) / (m + p - 1) for GPipe and 1F1B, and steps/s (CPU, gloo).

Each schedule of ``torch.distributed.pipelining`` runs a GPT-2 split by cadence's pipeline
(``parallelism_config.pp``: :func:`cadence.parallel.pipeline.parallelize_pipeline`) on
``p`` ranks with ``m`` microbatches. A rank's busy time is the time it spends in its
stages' compute actions (``forward_one_chunk``, ``backward_one_chunk``,
``backward_weight_one_chunk``, timed around each call); the rest of the step is idle
(waiting for a neighbour: the bubble, plus communication). The bubble is idle / step time,
averaged over ranks and over the timed steps (after one warm-up step).

On a CPU shared with other work the ranks compete for cores, which inflates busy time
and hides idle time: the absolute figures are this machine's, the order between schedules
is what carries over. The load average is printed with the table.

    python benchmarks/pipeline.py [--ranks 2 4] [--microbatches 8] [--steps 4] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, loadavg  # noqa: E402

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV")
THEORY = ("GPipe", "1F1B")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _BusyClock:
    """Seconds spent in the stages' compute actions, summed (patched onto the stage class)."""

    def __init__(self) -> None:
        self.busy = 0.0

    def install(self) -> None:
        from torch.distributed.pipelining.stage import _PipelineStageBase

        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            original = getattr(_PipelineStageBase, name)

            def timed(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return __original(*args, **kwargs)
                finally:
                    self.busy += time.perf_counter() - start

            setattr(_PipelineStageBase, name, timed)


def _measure(schedule: str, args: argparse.Namespace, clock: _BusyClock) -> dict[str, float]:
    import torch.distributed as torch_dist

    from cadence.models.gpt import gpt2
    from cadence.parallel import ParallelDims, ParallelPlan
    from cadence.parallel.config import parse_parallelism_config
    from cadence.parallel.pipeline import build_schedule, parallelize_pipeline

    world = torch_dist.get_world_size()
    config = parse_parallelism_config({"pp": {"pipeline_parallel_degree": world,
                                              "schedule": schedule}})
    dims = ParallelDims.from_config(config)
    torch.manual_seed(0)
    model = gpt2(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                 vocab_size=args.vocab_size, max_seq_len=args.seq_len,
                 tie_word_embeddings=False)
    pipeline = parallelize_pipeline(model, ParallelPlan(config, dims=dims, seed=0))
    batch = args.microbatches * args.microbatch_size
    ids = torch.randint(0, args.vocab_size, (batch, args.seq_len))
    microbatches = [{"input_ids": chunk, "labels": chunk}
                    for chunk in ids.split(args.microbatch_size)]

    def loss_fn(output: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        microbatch = microbatches[int(index.reshape(-1)[0])]
        return model.loss(pipeline.split.outputs(output, microbatch), microbatch) \
            / args.microbatches

    schedule_obj = build_schedule(pipeline, args.microbatches, loss_fn)
    step_s, busy_s = [], []
    for step in range(args.steps + 1):
        model.zero_grad(set_to_none=True)
        torch_dist.barrier()
        clock.busy, start = 0.0, time.perf_counter()
        schedule_obj.step(*((ids,) if pipeline.has_first_stage else ()),
                          target=torch.arange(args.microbatches)
                          if pipeline.has_last_stage else None, losses=[])
        elapsed = time.perf_counter() - start
        if step > 0:  # the first step builds the stages' buffers
            step_s.append(elapsed)
            busy_s.append(clock.busy)
    total, busy = sum(step_s), sum(busy_s)
    return {"step_s": total / len(step_s), "bubble": 1.0 - busy / total}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "HF_HUB_OFFLINE": "1"})
    torch.set_num_threads(1)
    import torch.distributed as torch_dist

    torch_dist.init_process_group("gloo", rank=rank, world_size=world)
    clock = _BusyClock()
    clock.install()
    results = {}
    for schedule in args.schedules:
        mine = _measure(schedule, args, clock)
        every = [None] * world
        torch_dist.all_gather_object(every, mine)
        results[schedule] = {"step_s": max(r["step_s"] for r in every),
                             "bubble": sum(r["bubble"] for r in every) / world}
    if rank == 0:
        torch.save(results, out)
    torch_dist.destroy_process_group()


def run(world: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every schedule of ``args.schedules`` on ``world`` ranks: ``{schedule: {step_s,
    bubble}}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.pt")
        mp.start_processes(_rank, args=(world, _free_port(), args, out), nprocs=world,
                           start_method="spawn")
        return torch.load(out)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch_size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--n_layer", type=int, default=8)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--vocab_size", type=int, default=1024)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if any(2 * p > args.n_layer for p in args.ranks):
        parser.error("--n_layer must be at least 2 x the largest --ranks (two stages per rank)")
    before = loadavg()
    rows = []
    for world in args.ranks:
        results = run(world, args)
        m = args.microbatches
        for schedule in args.schedules:
            r = results[schedule]
            theory = f"{(world - 1) / (m + world - 1):.3f}" if schedule in THEORY else "-"
            rows.append([schedule, str(world), str(m), f"{r['bubble']:.3f}", theory,
                         f"{1.0 / r['step_s']:.2f}"])
    print(f"python benchmarks/pipeline.py {' '.join(argv if argv is not None else sys.argv[1:])}"
          f"\nGPT-2 {args.n_layer} layers x {args.n_embd} wide, seq {args.seq_len}, "
          f"microbatch {args.microbatch_size}, fp32, gloo on CPU ({os.cpu_count()} cores), "
          f"1 thread per rank; load average {before} before, {loadavg()} after\n")
    print(format_table(["schedule", "p", "m", "bubble measured", "bubble theory (p-1)/(m+p-1)",
                        "steps/s"], rows, args.markdown))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
