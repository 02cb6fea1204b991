"""Expert parallelism on gloo ranks (CPU): all-to-all bytes per step, the tokens-per-expert
spread and steps/s of a small Mixtral, EP=1 (FSDP2 alone), EP=2 and EP=4 on 2 and 4 ranks.

Each arm trains ``--steps`` steps of a transformers Mixtral built from a config (no
download) through the Trainer with ``parallelism_config: {fsdp: {}, ep: {...}}``. Per step
and rank: the bytes the experts' all-to-alls send to other ranks (dispatch and combine in
forward, as many again in backward: ``module.all_to_all_bytes`` x 2, summed over the MoE
layers), and, over every data-parallel rank, the routed (token, expert) pairs per expert
(``expert_load``): the spread is the busiest expert's count over the mean (1.00: perfectly
balanced) and the idlest's. Steps/s is rank 0's, after the first (warm-up) step.

    python benchmarks/expert_parallel.py [--markdown] [--steps 6] [--hidden 64]
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

ARMS = ((2, 1), (2, 2), (4, 1), (4, 2), (4, 4))  # (world size, expert_parallel_degree)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _measure(ep: int, args: argparse.Namespace) -> dict[str, Any]:
    from torch.utils.data import DataLoader
    from transformers import MixtralConfig, MixtralForCausalLM

    from cadence import Callback, Trainer, dist
    from cadence.models import HuggingFaceModel
    from cadence.parallel.expert_parallel import expert_load

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                           intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                           num_attention_heads=4, num_key_value_heads=2,
                           num_local_experts=args.experts, num_experts_per_tok=2,
                           max_position_embeddings=args.seq, output_router_logits=True)
    model = HuggingFaceModel(MixtralForCausalLM(config))
    world = dist.get_world_size()
    ids = torch.randint(0, args.vocab, (args.batch * world * args.steps, args.seq),
                        generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    loader = DataLoader(data, batch_size=args.batch, sampler=dist.get_sampler(data, shuffle=False))
    steps: list[dict[str, float]] = []

    class Record(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            modules = [m for m in state.model.modules() if hasattr(m, "all_to_all_bytes")]
            sent = torch.tensor(float(sum(2 * m.all_to_all_bytes for m in modules)))
            torch.distributed.all_reduce(sent)
            spread = [(c.max() / c.float().mean(), c.min() / c.float().mean())
                      for c in expert_load(state.model).values()]
            steps.append({"time": time.perf_counter(), "bytes": float(sent) / world,
                          "max": max((float(a) for a, _ in spread), default=float("nan")),
                          "min": min((float(b) for _, b in spread), default=float("nan"))})

    parallelism: dict[str, Any] = {"fsdp": {}}
    if ep > 1:
        parallelism["ep"] = {"expert_parallel_degree": ep}
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{args.steps}ba",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3),
                      progress_bar=False, seed=0, parallelism_config=parallelism, device="cpu",
                      callbacks=[Record()])
    trainer.fit()
    timed = steps[1:]
    return {"bytes": sum(s["bytes"] for s in timed) / len(timed),
            "max": sum(s["max"] for s in timed) / len(timed),
            "min": min(s["min"] for s in timed),
            "steps_per_s": (len(timed) - 1) / (timed[-1]["time"] - timed[0]["time"])
            if len(timed) > 1 else float("nan"),
            "params": sum(p.numel() for p in model.parameters())}


def _rank(rank: int, world: int, port: int, ep: int, args: argparse.Namespace,
          out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    result = _measure(ep, args)
    if rank == 0:
        torch.save(result, out)
    import torch.distributed as torch_dist

    torch_dist.destroy_process_group()


def run(world: int, ep: int, args: argparse.Namespace) -> dict[str, Any]:
    """One arm on ``world`` spawned gloo ranks: rank 0's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.pt")
        mp.start_processes(_rank, args=(world, _free_port(), ep, args, out), nprocs=world,
                           start_method="spawn")
        return torch.load(out)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="samples per rank and step")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be at least 3 (one warm-up step, two timed)")
    before = loadavg()
    rows, params = [], 0
    for world, ep in ARMS:
        r = run(world, ep, args)
        params = r["params"]
        rows.append([f"{world} ranks, EP={ep}" + (" (FSDP2 only)" if ep == 1 else ""),
                     f"{r['bytes'] / 2**10:.1f}",
                     "-" if ep == 1 else f"{r['max']:.2f}",
                     "-" if ep == 1 else f"{r['min']:.2f}",
                     f"{r['steps_per_s']:.2f}"])
    tokens = args.batch * args.seq * 2
    print(f"Mixtral {args.layers} layers x {args.hidden} wide, {args.experts} experts top-2, "
          f"{params:,} parameters, fp32; {args.batch} x {args.seq} tokens per rank and step "
          f"({tokens} routed pairs per layer); mean of steps 2-{args.steps}; load average "
          f"{before} before, {loadavg()} after\n")
    print(format_table(["arm", "all-to-all KiB per step per rank", "busiest expert / mean",
                        "idlest expert / mean (min)", "steps/s"], rows, args.markdown))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
