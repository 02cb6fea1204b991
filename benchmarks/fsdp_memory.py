"""Per-rank bytes of parameters, gradients and optimizer state under DDP-style replication,
FSDP2's sharding strategies (world size 1 and 2), tensor parallelism (TP=2 on 2 ranks) and
FSDP2 x TP (a 2 x 2 mesh on 4 ranks) (CPU, gloo).

The classic DDP-vs-FSDP memory comparison of the FSDP tutorials, measured from each rank's
local shards (``DTensor.to_local()``) after one AdamW step of a GPT-2, rather than from the
allocator, so it is exact and the same on CPU and GPU.

    python benchmarks/fsdp_memory.py [--n_layer 8 --n_embd 256] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
import torch.multiprocessing as mp

STRATEGIES = ("DDP", "NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")
# name -> (world size, parallelism_config): tensor parallelism, alone and under FSDP2
TP_ARMS: dict[str, tuple[int, dict[str, Any]]] = {
    "TP=2": (2, {"tp": {"tensor_parallel_degree": 2}}),
    "FULL_SHARD x TP=2": (4, {"fsdp": {"sharding_strategy": "FULL_SHARD"},
                              "tp": {"tensor_parallel_degree": 2}}),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _measure(strategy: str, args: argparse.Namespace) -> dict[str, int]:
    from torch.utils.data import DataLoader

    from cadence import Trainer, dist
    from cadence.models.gpt import gpt2
    from cadence.parallel.memory import local_state_bytes

    torch.manual_seed(0)
    model = gpt2(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                 vocab_size=args.vocab_size, max_seq_len=args.seq_len)
    ids = torch.randint(0, args.vocab_size, (8 * dist.get_world_size(), args.seq_len))
    data = [{"input_ids": row, "labels": row} for row in ids]
    loader = DataLoader(data, batch_size=8, sampler=dist.get_sampler(data, shuffle=False))
    if strategy in TP_ARMS:
        config: Optional[dict[str, Any]] = TP_ARMS[strategy][1]
    else:
        config = None if strategy == "DDP" else {"fsdp": {"sharding_strategy": strategy}}
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba",
                      progress_bar=False, seed=0, parallelism_config=config, device="cpu")
    trainer.fit()
    return {
        **local_state_bytes(trainer.state.model, trainer.state.optimizer),
        "num_params": sum(p.numel() for p in model.parameters()),
    }


def _rank(rank: int, world: int, port: int, strategy: str, args: argparse.Namespace,
          out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    result = _measure(strategy, args)
    if rank == 0:
        torch.save(result, out)
    import torch.distributed as torch_dist

    torch_dist.destroy_process_group()


def run(strategy: str, world: int, args: argparse.Namespace) -> Optional[dict[str, Any]]:
    if world == 1 and strategy == "DDP":
        return _measure("DDP", args)  # one process, no wrapper: the baseline
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.pt")
        mp.start_processes(_rank, args=(world, _free_port(), strategy, args, out), nprocs=world,
                           start_method="spawn")
        return torch.load(out)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_layer", type=int, default=8)
    parser.add_argument("--n_head", type=int, default=8)
    parser.add_argument("--n_embd", type=int, default=256)
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no_tp", action="store_true", help="skip the TP and FSDP x TP rows")
    args = parser.parse_args(argv)
    rows = []
    for world in args.world_sizes:
        for strategy in STRATEGIES:
            result = run(strategy, world, args)
            assert result is not None
            rows.append((strategy, world, result))
    for name, (world, _) in ({} if args.no_tp else TP_ARMS).items():
        result = run(name, world, args)
        assert result is not None
        rows.append((name, world, result))
    num_params = rows[0][2]["num_params"]
    base = rows[0][2]
    base_total = base["params"] + base["grads"] + base["optimizer"]
    mib = 2**20
    print(f"GPT-2 {args.n_layer} layers x {args.n_embd} wide, {num_params:,} parameters, fp32, "
          f"AdamW; bytes held by each rank after one step (local shards)\n")
    print("| strategy | world size | params MiB | grads MiB | optimizer MiB | total MiB | "
          "vs 1 process |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for strategy, world, r in rows:
        total = r["params"] + r["grads"] + r["optimizer"]
        print(f"| {strategy} | {world} | {r['params'] / mib:.2f} | {r['grads'] / mib:.2f} | "
              f"{r['optimizer'] / mib:.2f} | {total / mib:.2f} | {total / base_total:.3f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
