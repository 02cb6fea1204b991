"""Pipeline bubbles per schedule: the measured idle fraction of each rank's step beside the
theory (p - 1) / (m + p - 1) for GPipe and 1F1B, peak activation memory per stage, and
steps/s (CPU, gloo).

Each schedule of ``torch.distributed.pipelining`` runs a GPT-2 split by cadence's pipeline
(``parallelism_config.pp``: :func:`cadence.parallel.pipeline.parallelize_pipeline`) on
``p`` ranks with ``m`` microbatches. A rank's busy time is the time it spends in its
stages' compute actions (``forward_one_chunk``, ``backward_one_chunk``,
``backward_weight_one_chunk``, timed around each call); the rest of the step is idle
(waiting for a neighbour: the bubble, plus communication). The bubble is idle / step time,
averaged over ranks and over the timed steps (after one warm-up step).

Peak activation memory per stage: the bytes autograd holds for backward (each tensor a
stage's forward saves, through ``torch.autograd.graph.saved_tensors_hooks``; one count per
storage, the stage's parameters left out), counted while saved and until the graph that
holds them is freed, and the most alive at once during the timed steps. Beside it, that
peak over one microbatch's forward: how many microbatches' activations the stage holds at
its peak (GPipe: all ``m``; 1F1B: at most ``p - s`` on stage ``s``). Memory figures do not
depend on the machine's load; timing figures do.

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


class _Held:
    """One saved tensor's place in its stage's count; the count drops when autograd frees it."""

    __slots__ = ("tensor", "meter", "key", "__weakref__")

    def __init__(self, tensor: torch.Tensor, meter: "_ActivationMeter", key: Any) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter.release(self.key)


class _ActivationMeter:
    """Bytes a stage's forwards saved for backward and autograd still holds: now, at the
    peak, and the most one forward added (``reset`` before the timed steps)."""

    def __init__(self, parameters: set[int]) -> None:
        self.parameters = parameters  # storage pointers of the stage's own parameters
        self.live: dict[Any, list[int]] = {}  # storage -> [bytes, holders]
        self.bytes = self.peak = self.per_forward = self.added = 0

    def reset(self) -> None:
        self.peak, self.per_forward = self.bytes, 0

    def pack(self, tensor: torch.Tensor) -> Any:
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device)
        if storage.data_ptr() in self.parameters or storage.nbytes() == 0:
            return tensor
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.bytes += entry[0]
            self.added += entry[0]
            self.peak = max(self.peak, self.bytes)
        entry[1] += 1
        return _Held(tensor, self, key)

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    def release(self, key: Any) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.bytes -= entry[0]
            del self.live[key]


class _ActivationMeters:
    """One :class:`_ActivationMeter` per stage index, fed by the stages' forwards."""

    def __init__(self) -> None:
        self.meters: dict[int, _ActivationMeter] = {}

    def install(self) -> None:
        from torch.distributed.pipelining.stage import _PipelineStageBase

        original = _PipelineStageBase.forward_one_chunk

        def metered(stage: Any, *args: Any, **kwargs: Any) -> Any:
            meter = self.meters.get(stage.stage_index)
            if meter is None:
                pointers = {p.untyped_storage().data_ptr()
                            for p in stage.submod.parameters()}
                meter = self.meters[stage.stage_index] = _ActivationMeter(pointers)
            before = meter.added
            with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                out = original(stage, *args, **kwargs)
            meter.per_forward = max(meter.per_forward, meter.added - before)
            return out

        _PipelineStageBase.forward_one_chunk = metered  # type: ignore[method-assign]


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


def _measure(schedule: str, args: argparse.Namespace, clock: _BusyClock,
             meters: _ActivationMeters) -> dict[str, Any]:
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
    meters.meters = {}
    for step in range(args.steps + 1):
        model.zero_grad(set_to_none=True)
        torch_dist.barrier()
        if step == 1:
            for meter in meters.meters.values():
                meter.reset()
        clock.busy, start = 0.0, time.perf_counter()
        schedule_obj.step(*((ids,) if pipeline.has_first_stage else ()),
                          target=torch.arange(args.microbatches)
                          if pipeline.has_last_stage else None, losses=[])
        elapsed = time.perf_counter() - start
        if step > 0:  # the first step builds the stages' buffers
            step_s.append(elapsed)
            busy_s.append(clock.busy)
    total, busy = sum(step_s), sum(busy_s)
    memory = {index: (m.peak, m.per_forward) for index, m in meters.meters.items()}
    return {"step_s": total / len(step_s), "bubble": 1.0 - busy / total, "memory": memory}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "HF_HUB_OFFLINE": "1"})
    torch.set_num_threads(1)
    import torch.distributed as torch_dist

    torch_dist.init_process_group("gloo", rank=rank, world_size=world)
    clock = _BusyClock()
    clock.install()
    meters = _ActivationMeters()
    meters.install()
    results = {}
    for schedule in args.schedules:
        mine = _measure(schedule, args, clock, meters)
        every: list[Any] = [None] * world
        torch_dist.all_gather_object(every, mine)
        results[schedule] = {"step_s": max(r["step_s"] for r in every),
                             "bubble": sum(r["bubble"] for r in every) / world,
                             "memory": {k: v for r in every for k, v in r["memory"].items()}}
    if rank == 0:
        torch.save(results, out)
    torch_dist.destroy_process_group()


def run(world: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every schedule of ``args.schedules`` on ``world`` ranks: ``{schedule: {step_s,
    bubble, memory: {stage: (peak bytes, one forward's bytes)}}}``."""
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
            stages = [r["memory"][s] for s in sorted(r["memory"])]
            peaks = " / ".join(f"{peak / 2**20:.1f}" for peak, _ in stages)
            held = " / ".join(f"{peak / one:.1f}" if one else "-" for peak, one in stages)
            rows.append([schedule, str(world), str(m), f"{r['bubble']:.3f}", theory,
                         peaks, held, f"{1.0 / r['step_s']:.2f}"])
    print(f"python benchmarks/pipeline.py {' '.join(argv if argv is not None else sys.argv[1:])}"
          f"\nGPT-2 {args.n_layer} layers x {args.n_embd} wide, seq {args.seq_len}, "
          f"microbatch {args.microbatch_size}, fp32, gloo on CPU ({os.cpu_count()} cores), "
          f"1 thread per rank; load average {before} before, {loadavg()} after\n")
    print(format_table(["schedule", "p", "m", "bubble measured (load-dependent)",
                        "bubble theory (p-1)/(m+p-1)", "peak activations MiB, stage 0 / 1 / ...",
                        "microbatches held at peak, per stage",
                        "steps/s (load-dependent)"], rows, args.markdown))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
