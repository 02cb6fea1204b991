"""Peak host memory (RSS) and seconds to load a GPT-2-shaped Hugging Face model of about
1 GiB with FSDP2 on 1, 2 and 4 gloo ranks, before the first step (CPU).

Arms, each rank a fresh process (its peak RSS read by ``_common.measure_command``):

- ``from_pretrained``: ``hf_pretrained(folder)`` in one process, no parallelism (every
  rank of a plain data-parallel run pays this). transformers 5 maps the safetensors files
  and faults pages in as they are used, so every arm reads each of its weights once
  (a sum) before it reports: the peak a first step would see.
- ``stream``: ``hf_pretrained(folder, init_device="meta")``, then the parallelize plan with
  ``fsdp`` (shard on meta, ``to_empty``, ``init_weights`` reads this rank's slices of the
  safetensors files, :mod:`cadence.parallel.hf_weights`).
- ``scratch``: the same architecture built on meta and randomly initialised after sharding
  (``init_device: meta`` from scratch, :mod:`cadence.parallel.param_init`).
- ``control``: the ``stream`` arm with a tiny model, on the same number of ranks: imports,
  gloo and the process itself, subtracted from each arm's figure (rank by rank).

The checkpoint is written with ``save_pretrained`` (safetensors, split into files of
``--shard_mb``) in a temporary folder. The target (issue 22) for every rank, rank 0
included: model MiB < 1.3 x (model MiB / ranks) + the largest tensor's MiB.

    python benchmarks/model_loading.py [--size_gib 1.0] [--ranks 1 2 4] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, child_env, format_table, loadavg, measure_command  # noqa: E402

VOCAB, POSITIONS, WIDTH, HEADS = 50257, 1024, 2048, 16


def _layers_for(size_gib: float) -> int:
    """GPT-2 blocks for a model of about ``size_gib`` GiB in fp32 at width 2048."""
    per_layer = 12 * WIDTH ** 2 + 13 * WIDTH
    fixed = VOCAB * WIDTH + POSITIONS * WIDTH + 2 * WIDTH
    return max(1, round((size_gib * 2 ** 30 / 4 - fixed) / per_layer))


def _config(n_layer: int, tiny: bool = False) -> Any:
    from transformers import GPT2Config

    if tiny:
        return GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                          bos_token_id=None, eos_token_id=None, use_cache=False)
    return GPT2Config(n_layer=n_layer, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB,
                      n_positions=POSITIONS, use_cache=False)


def _write_checkpoint(folder: Path, n_layer: int, tiny: bool, shard_mb: int) -> dict[str, int]:
    import torch
    from transformers import GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(_config(n_layer, tiny))
    model.to_empty(device="cpu")
    model.tie_weights()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    model.save_pretrained(folder, max_shard_size=f"{shard_mb}MB")
    sizes = [p.numel() * 4 for p in model.parameters()]
    return {"bytes": sum(sizes), "largest": max(sizes),
            "files": len(list(folder.glob("*.safetensors")))}


# ----------------------------------------------------------------------------- a rank
def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as torch_dist

    torch.set_num_threads(1)
    start = time.perf_counter()
    if args.worker != "from_pretrained":
        torch_dist.init_process_group("gloo", rank=args.rank, world_size=args.world,
                                      init_method=f"tcp://127.0.0.1:{args.port}")
    from cadence.models.gpt import gpt2, hf_pretrained
    from cadence.parallel import ParallelPlan, parallelize, parse_parallelism_config

    ready = time.perf_counter()
    if args.worker == "from_pretrained":
        model = hf_pretrained(args.folder)
    else:
        if args.worker == "scratch":
            model = gpt2(n_layer=args.n_layer, n_head=HEADS, n_embd=WIDTH, vocab_size=VOCAB,
                         max_seq_len=POSITIONS, init_device="meta")
        else:  # stream, control
            model = hf_pretrained(args.folder, init_device="meta")
        parallelize(model, ParallelPlan(parse_parallelism_config({"fsdp": {}}), seed=0))
    from cadence.utils.dtensor import local_tensor

    with torch.no_grad():  # touch every weight: from_pretrained's may still be mapped pages
        for param in model.parameters():
            local_tensor(param).sum()
    loaded = time.perf_counter()
    print(json.dumps({"rank": args.rank, "load_s": loaded - ready, "total_s": loaded - start}),
          flush=True)
    if torch_dist.is_initialized():
        torch_dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # the figure is the peak up to here: skip teardown


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_arm(arm: str, world: int, folder: Path, n_layer: int) -> list[dict[str, float]]:
    """Every rank of one arm at once; per rank: peak MiB, load seconds."""
    port = _free_port()
    results: list[dict[str, float]] = [{} for _ in range(world)]

    def one(rank: int) -> None:
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", arm,
                "--folder", str(folder), "--rank", str(rank), "--world", str(world),
                "--port", str(port), "--n_layer", str(n_layer)]
        env = {**child_env(), "OMP_NUM_THREADS": "1"}
        measured = measure_command(argv, cwd=REPO, env=env, capture_output=True, timeout=1800)
        if measured.returncode != 0:
            raise RuntimeError(f"{arm} rank {rank}/{world} failed:\n{measured.stderr}")
        line = [x for x in (measured.stdout or "").splitlines() if x.startswith("{")][-1]
        results[rank] = {"peak_mib": measured.peak_mib, **json.loads(line)}

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(not r for r in results):
        raise RuntimeError(f"{arm} on {world} ranks did not report every rank")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size_gib", type=float, default=1.0, help="model size, fp32 GiB")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--shard_mb", type=int, default=200,
                        help="safetensors file size of the checkpoint, MB")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--n_layer", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return

    n_layer = _layers_for(args.size_gib)
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="cadence-loading-") as tmp:
        big, tiny = Path(tmp, "gpt2"), Path(tmp, "tiny")
        info = _write_checkpoint(big, n_layer, False, args.shard_mb)
        _write_checkpoint(tiny, n_layer, True, args.shard_mb)
        mib, largest = info["bytes"] / 2 ** 20, info["largest"] / 2 ** 20
        control1 = _run_arm("control", 1, tiny, n_layer)
        rows: list[list[str]] = []

        def add(arm: str, world: int, results: list[dict[str, float]],
                control: list[dict[str, float]]) -> None:
            target = 1.3 * mib / world + largest
            for r, res in enumerate(results):
                model_mib = res["peak_mib"] - control[r]["peak_mib"]
                rows.append([arm, str(world), str(r), f"{res['peak_mib']:.0f}",
                             f"{model_mib:.0f}", f"{model_mib / mib:.2f}", f"{target:.0f}",
                             "yes" if model_mib < target else "NO", f"{res['load_s']:.1f}"])

        add("from_pretrained", 1, _run_arm("from_pretrained", 1, big, n_layer), control1)
        for world in args.ranks:
            control = control1 if world == 1 else _run_arm("control", world, tiny, n_layer)
            add("stream", world, _run_arm("stream", world, big, n_layer), control)
            add("scratch (meta)", world, _run_arm("scratch", world, big, n_layer), control)

    headers = ["arm", "ranks", "rank", "peak MiB", "model MiB", "x model", "target MiB",
               "under", "load s"]
    print(f"$ python benchmarks/model_loading.py --size_gib {args.size_gib} --ranks "
          f"{' '.join(map(str, args.ranks))}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; load average {load_before} before, {loadavg()} after")
    print(f"model: GPT-2 shape, {n_layer} blocks x {WIDTH} wide, vocabulary {VOCAB}: "
          f"{mib:.0f} MiB fp32 in {info['files']} safetensors files; largest tensor (wte) "
          f"{largest:.0f} MiB. model MiB = peak - the tiny control's peak on that rank; "
          f"target = 1.3 x model / ranks + largest.")
    print(format_table(headers, rows, args.markdown))


if __name__ == "__main__":
    main()
