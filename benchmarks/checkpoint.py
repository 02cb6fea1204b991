"""Checkpoint save / load time and size, ``full`` vs ``sharded``, on 1 and 2 ranks (CPU, gloo);
and resume time at the start vs the end of a long epoch.

Save / load: a GPT-2 of about 100 M parameters (default 12 layers x 768 wide, vocabulary
8,192, 256 positions: 92 M) trained one step with AdamW, so a checkpoint holds the
parameters and twice as much optimizer state (``exp_avg``, ``exp_avg_sq``), fp32. Timed
with :func:`cadence.checkpoint.save_checkpoint` / ``load_checkpoint`` (what the
``CheckpointSaver`` and ``load_path`` call), every rank in step (barrier before and after),
median over ``--repeats``. Two ranks are FSDP2 FULL_SHARD processes started with
``torch.multiprocessing`` (spawn), as ``benchmarks/fsdp_memory.py`` does. ``full`` gathers the
model and optimizer to rank 0, which writes one file (and on load reads it and broadcasts);
``sharded`` writes a ``torch.distributed.checkpoint`` directory, each rank its own shard.
Saves include ``fsync``; loads read a file just written, so mostly from the page cache.

Checksums: each save / load is timed with the CRC32C checksums (the default: hashed while
writing, every file verified before loading; a full file's verification overlaps its
``torch.load``) and without (``checksums=False``), alternating, after one uncounted warm-up
round; "verify alone" times the verification by itself (from the page cache). The target is
verification under 10 % of load time.

Resume: a tiny model over a dataset of ``--resume_samples`` small samples (8 floats and a
label; 8 per batch), with checkpoints whose position is the first batch or the last batch
of the epoch. Timed: constructing the Trainer with ``autoresume`` (finding and loading the
checkpoint) until the first batch after the checkpoint is ready (``AFTER_DATALOADER``).
The resume path skips consumed samples by index (``SkipSampler``), so start and end should
be close; the baseline is the naive way, iterating the dataloader through the consumed
batches.

    python benchmarks/checkpoint.py                    # about 5 minutes on 2 CPU cores
    python benchmarks/checkpoint.py --repeats 1 --n_layer 2   # a quick look
    python benchmarks/checkpoint.py --world_sizes 1 --skip_resume   # the save/load tables only

Object storage: ``CheckpointSaver.save`` / load to a local folder vs to a local S3 server
(moto's ``ThreadedMotoServer`` on 127.0.0.1, started by the benchmark; s3fs), one process,
median of ``--repeats``; the ratio is of the same run::

    python benchmarks/checkpoint.py --s3_only --n_layer 2 --repeats 3   # that table only

Asynchronous saves (``save_async``): the seconds the training loop is blocked per save, the
synchronous save's time vs the time an asynchronous save takes to stage the state to CPU
memory (:class:`cadence.checkpoint.async_save.AsyncCheckpointer`); the target is
async at most 20 % of sync.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.multiprocessing as mp

FORMATS = ("full", "sharded")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _disk_bytes(path: Path) -> tuple[int, int]:
    """Bytes and number of files of a checkpoint file or directory."""
    if path.is_file():
        return path.stat().st_size, 1
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


# ---------------------------------------------------------------- save / load


def _trained_state(args: argparse.Namespace) -> Any:
    """A Trainer's state after one AdamW step of the big GPT-2 (FSDP FULL_SHARD on 2 ranks)."""
    from torch.utils.data import DataLoader

    from cadence import Trainer, dist
    from cadence.models.gpt import gpt2

    torch.manual_seed(0)
    model = gpt2(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                 vocab_size=args.vocab_size, max_seq_len=args.seq_len)
    ids = torch.randint(0, args.vocab_size, (dist.get_world_size(), 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    loader = DataLoader(data, batch_size=1, sampler=dist.get_sampler(data, shuffle=False))
    config = None
    if dist.get_world_size() > 1:
        config = {"fsdp": {"sharding_strategy": "FULL_SHARD"}}
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba", seed=0,
                      progress_bar=False, parallelism_config=config, device="cpu")
    trainer.fit()
    return trainer.state, sum(p.numel() for p in model.parameters())


def _measure_save_load(args: argparse.Namespace, folder: str) -> list[dict[str, Any]]:
    from cadence import dist
    from cadence.checkpoint import load_checkpoint, manifest, save_checkpoint
    from cadence.checkpoint.checkpoint import verify

    state, num_params = _trained_state(args)
    rank0 = dist.get_global_rank() == 0
    rows = []
    for fmt in FORMATS:
        # none and CRC32C alternate, after one uncounted warm-up round of each
        times: dict[bool, dict[str, list[float]]] = {
            c: {"save": [], "load": [], "verify": []} for c in (False, True)}
        size, files = 0, 0
        for repeat in range(args.repeats + 1):
            for checksums in (False, True):
                name = f"{fmt}-{'crc' if checksums else 'plain'}-{repeat}"
                path = Path(folder) / (name + (".pt" if fmt == "full" else ""))
                dist.barrier()
                start = time.perf_counter()
                save_checkpoint(state, path, fmt, checksums=checksums)
                dist.barrier()
                saved = time.perf_counter() - start
                if rank0:
                    size, files = _disk_bytes(path)
                dist.barrier()
                start = time.perf_counter()
                load_checkpoint(state, path, checksums=checksums)
                dist.barrier()
                loaded = time.perf_counter() - start
                verified = 0.0
                if checksums:  # verification alone, as the load above did it (page cache)
                    manifest._verified.clear()  # forget that the load verified these files
                    dist.barrier()
                    start = time.perf_counter()
                    verify(path, part=(dist.get_global_rank(), dist.get_world_size()))
                    dist.barrier()
                    verified = time.perf_counter() - start
                if rank0:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
                if repeat > 0:
                    for key, value in (("save", saved), ("load", loaded), ("verify", verified)):
                        times[checksums][key].append(value)
        for checksums in (False, True):
            t = times[checksums]
            rows.append({"format": fmt, "ranks": dist.get_world_size(), "params": num_params,
                         "checksums": checksums, "save": statistics.median(t["save"]),
                         "load": statistics.median(t["load"]),
                         "verify": statistics.median(t["verify"]), "save_all": t["save"],
                         "load_all": t["load"], "bytes": size, "files": files})
        rows[-1].update(_measure_async(state, fmt, Path(folder), args.repeats))
    return rows


def _measure_async(state: Any, fmt: str, folder: Path, repeats: int) -> dict[str, Any]:
    """Seconds the loop is blocked by an asynchronous save (``save_async``: staging to CPU
    memory, until :meth:`AsyncCheckpointer.save` returns), and until the background write is
    on disk and renamed (:meth:`AsyncCheckpointer.wait`); with checksums, after one uncounted
    warm-up, median over ``repeats``. The loop is idle while the writer works here; in a real
    run the two share the CPU."""
    from cadence import dist
    from cadence.checkpoint.async_save import AsyncCheckpointer

    writer = AsyncCheckpointer()
    blocked, written = [], []
    for repeat in range(repeats + 1):
        path = folder / (f"{fmt}-async-{repeat}" + (".pt" if fmt == "full" else ""))
        dist.barrier()
        start = time.perf_counter()
        writer.save(state, path, fmt)
        staged = time.perf_counter() - start  # the loop would go on here
        writer.wait()
        dist.barrier()
        if repeat > 0:
            blocked.append(staged)
            written.append(time.perf_counter() - start)
        if dist.get_global_rank() == 0:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    writer.close()
    return {"async_blocked": statistics.median(blocked),
            "async_written": statistics.median(written), "async_blocked_all": blocked}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, folder: str,
          out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    rows = _measure_save_load(args, folder)
    if rank == 0:
        torch.save(rows, out)
    import torch.distributed as torch_dist

    torch_dist.destroy_process_group()


def save_load(world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        if world == 1:
            return _measure_save_load(args, folder)
        out = str(Path(folder) / "result.pt")
        mp.start_processes(_rank, args=(world, _free_port(), args, folder, out), nprocs=world,
                           start_method="spawn")
        return list(torch.load(out, weights_only=True))


# ---------------------------------------------------------------- object storage


def _moto_server() -> Any:
    """Start moto's S3 server on 127.0.0.1 (a free port) and point s3fs at it (environment
    variables, as a real run reads its credentials); returns the server and a fresh bucket
    URL."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("bench")
    return server, "s3://bench/run"


def remote_vs_local(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Save / load seconds, one process, through what a run does: ``CheckpointSaver.save``
    (write, then for S3 upload, completion marker, pointer) and ``load_checkpoint`` (for S3
    after downloading, :func:`~cadence.checkpoint.remote.fetched`); a local folder vs
    the local moto S3 server, alternating, median of ``--repeats`` after one warm-up."""
    from cadence.callbacks.checkpoint_saver import CheckpointSaver
    from cadence.checkpoint import load_checkpoint
    from cadence.checkpoint.remote import fetched

    server, bucket = _moto_server()
    rows = []
    try:
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            os.environ["XDG_CACHE_HOME"] = str(Path(folder) / "stage")
            state, _ = _trained_state(args)
            for fmt in FORMATS:
                times: dict[str, dict[str, list[float]]] = {
                    where: {"save": [], "load": []} for where in ("disk", "s3")}
                size = 0
                for repeat in range(args.repeats + 1):
                    for where, root in (("disk", str(Path(folder) / "disk")), ("s3", bucket)):
                        saver = CheckpointSaver(folder=root, state_dict_type=fmt,
                                                overwrite=True, symlink_filename=None)
                        start = time.perf_counter()
                        path = saver.save(state, filename=f"{fmt}-{repeat}")
                        saved = time.perf_counter() - start
                        target = saver.saved_checkpoints[-1]
                        start = time.perf_counter()
                        with fetched(target) as local:
                            load_checkpoint(state, local)
                        loaded = time.perf_counter() - start
                        if where == "s3":
                            saver.remote_folder(state).remove(Path(target).name)
                        else:
                            size = _disk_bytes(Path(path))[0]
                            shutil.rmtree(path) if Path(path).is_dir() else Path(path).unlink()
                        if repeat > 0:
                            times[where]["save"].append(saved)
                            times[where]["load"].append(loaded)
                rows.append({"format": fmt, "bytes": size, **{f"{k}_{where}": statistics.median(v)
                                               for where, t in times.items()
                                               for k, v in t.items()}})
    finally:
        server.stop()
    return rows


# ---------------------------------------------------------------- resume


class _FirstBatchReady(Exception):
    """Raised at the first AFTER_DATALOADER, ending the timed resume."""


def _resume_parts(samples: int, batch_size: int) -> tuple[Any, Any]:
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from cadence import Callback, ComposerModel, dist

    class Linear(ComposerModel):
        """``x [batch, 8] -> logits [batch, 3]``: as small as a model gets."""

        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 3)

        def forward(self, batch: Any) -> torch.Tensor:
            return self.net(batch[0])

        def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
            return F.cross_entropy(outputs, batch[1])

    class FirstBatch(Callback):
        def after_dataloader(self, state: Any, logger: Any) -> None:
            raise _FirstBatchReady

    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 8, generator=gen),
                         torch.randint(0, 3, (samples,), generator=gen))

    def loader() -> DataLoader:
        return DataLoader(data, batch_size=batch_size,
                          sampler=dist.get_sampler(data, shuffle=True, seed=1))

    def trainer(folder: Path, autoresume: bool, **kwargs: Any) -> Any:
        from cadence import Trainer

        torch.manual_seed(0)
        return Trainer(model=Linear(), train_dataloader=loader(), max_duration="2ep",
                       progress_bar=False, run_name="resume", seed=0, save_folder=str(folder),
                       save_interval=None, autoresume=autoresume,
                       callbacks=[FirstBatch()] if autoresume else [], **kwargs)

    return loader, trainer


def resume(args: argparse.Namespace) -> list[dict[str, Any]]:
    from cadence.checkpoint import save_checkpoint
    from cadence.checkpoint.store import write_latest
    from cadence.core.time import Timestamp

    samples, batch_size = args.resume_samples, 8
    batches = samples // batch_size
    loader, make_trainer = _resume_parts(samples, batch_size)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for label, position in (("start", 1), ("end", batches - 1)):
            folder = Path(tmp) / label
            source = make_trainer(folder, autoresume=False)
            source.state.timestamp = Timestamp(
                batch=position, sample=position * batch_size, batch_in_epoch=position,
                sample_in_epoch=position * batch_size)
            save_checkpoint(source.state, folder / f"ep0-ba{position}.pt", "full")
            write_latest(folder, "latest-resume", f"ep0-ba{position}.pt")
            source.close()
            resumed, naive = [], []
            for _ in range(args.resume_repeats):
                start = time.perf_counter()
                trainer = make_trainer(folder, autoresume=True)
                try:
                    trainer.fit()
                except _FirstBatchReady:
                    resumed.append(time.perf_counter() - start)
                trainer.close()
                assert trainer.state.timestamp.batch_in_epoch == position
                start = time.perf_counter()
                iterator = iter(loader())
                for _ in range(position + 1):  # the consumed batches, then the next one
                    next(iterator)
                naive.append(time.perf_counter() - start)
            rows.append({"label": label, "position": position, "batches": batches,
                         "resume": statistics.median(resumed), "naive": statistics.median(naive),
                         "resume_all": resumed, "naive_all": naive})
    return rows


# ---------------------------------------------------------------- main


def _print_remote(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"Local disk vs a local S3 server (moto on 127.0.0.1, s3fs), GPT-2 {args.n_layer} "
          f"layers x {args.n_embd} wide, one process: CheckpointSaver.save (S3: written to "
          f"the stage, uploaded, marker, pointer) and load_checkpoint (S3: downloaded first), "
          f"with CRC32C; median of {args.repeats}\n")
    print("| format | MiB | save s, disk | save s, S3 | S3 / disk | load s, disk | load s, S3 | "
          "S3 / disk |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['format']} | {r['bytes'] / 2**20:,.0f} | {r['save_disk']:.2f} | "
              f"{r['save_s3']:.2f} | "
              f"{r['save_s3'] / r['save_disk']:.1f}x | {r['load_disk']:.2f} | "
              f"{r['load_s3']:.2f} | {r['load_s3'] / r['load_disk']:.1f}x |")
    print()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_layer", type=int, default=12)
    parser.add_argument("--n_head", type=int, default=12)
    parser.add_argument("--n_embd", type=int, default=768)
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="save/load repeats (median)")
    parser.add_argument("--resume_samples", type=int, default=200_000)
    parser.add_argument("--resume_repeats", type=int, default=3)
    parser.add_argument("--skip_resume", action="store_true", help="save/load tables only")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (a tmp dir)")
    parser.add_argument("--skip_s3", action="store_true",
                        help="skip local disk vs the local S3 server (needs s3fs, moto[server])")
    parser.add_argument("--s3_only", action="store_true",
                        help="only local disk vs the local S3 server")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    if not args.skip_s3:
        _print_remote(remote_vs_local(args), args)
        if args.s3_only:
            return
    rows = [row for world in args.world_sizes for row in save_load(world, args)]
    resumes = [] if args.skip_resume else resume(args)
    mib = 2**20
    params = rows[0]["params"]
    print(f"GPT-2 {args.n_layer} layers x {args.n_embd} wide, vocabulary {args.vocab_size}: "
          f"{params / 1e6:.1f} M parameters, fp32, AdamW state after one step (params + 2x "
          f"optimizer = {3 * params * 4 / mib:,.0f} MiB of tensors); CPU, "
          f"{torch.get_num_threads()} threads; median of {args.repeats}\n")
    print("| format | ranks | save s | load s | on disk MiB | files | save MiB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["checksums"]:
            print(f"| {r['format']} | {r['ranks']} | {r['save']:.2f} | {r['load']:.2f} | "
                  f"{r['bytes'] / mib:,.0f} | {r['files']} | "
                  f"{r['bytes'] / mib / r['save']:,.0f} |")
    print("\nCRC32C checksums (hashed while saving, every file verified before loading) vs "
          "none (checksums=False); the cost as a share of the time without\n")
    print("| format | ranks | save s, none | save s, CRC32C | save cost | load s, none | "
          "load s, CRC32C | load cost | verify alone s | verify / load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for plain, crc in zip(rows[::2], rows[1::2]):
        assert not plain["checksums"] and crc["checksums"]
        print(f"| {crc['format']} | {crc['ranks']} | {plain['save']:.2f} | {crc['save']:.2f} | "
              f"{(crc['save'] - plain['save']) / plain['save']:+.1%} | {plain['load']:.2f} | "
              f"{crc['load']:.2f} | {(crc['load'] - plain['load']) / plain['load']:+.1%} | "
              f"{crc['verify']:.3f} | {crc['verify'] / crc['load']:.1%} |")
    print("\nLoop blocked per save: synchronous (the whole save) vs save_async (staging to CPU "
          "memory; the files are written by a background thread), with CRC32C; async written: "
          "until the background write is on disk and renamed\n")
    print("| format | ranks | loop blocked per save (s), sync | loop blocked per save (s), async | "
          "async / sync | async written s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["checksums"]:
            print(f"| {r['format']} | {r['ranks']} | {r['save']:.2f} | {r['async_blocked']:.2f} | "
                  f"{r['async_blocked'] / r['save']:.1%} | {r['async_written']:.2f} |")
    if not resumes:
        print(f"\n(total {time.perf_counter() - started:.0f} s)")
        return
    print(f"\nResume in a {resumes[0]['batches']:,}-batch epoch ({args.resume_samples:,} samples, "
          f"8 per batch), median of {args.resume_repeats}: Trainer construction with autoresume "
          f"until the next batch is ready, vs iterating the dataloader through the consumed "
          f"batches\n")
    print("| checkpoint at | batch in epoch | autoresume to first batch s | naive replay s |")
    print("|---|---:|---:|---:|")
    for r in resumes:
        print(f"| {r['label']} of epoch | {r['position']:,} | {r['resume']:.3f} | "
              f"{r['naive']:.3f} |")
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
