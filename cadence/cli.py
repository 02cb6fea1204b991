"""The ``cadence`` command line.

::

    cadence train RUN.yaml [key=value ...]     # e.g. cadence train yamls/quickstart.yaml seed=3
    cadence launch -n 2 RUN.yaml [key=value ...]   # the same on 2 ranks, through torchrun
    cadence convert CHECKPOINT --to hf OUT_DIR     # model.safetensors + config (+ tokenizer)
    cadence convert CHECKPOINT --to full OUT.pt    # merge a sharded checkpoint into one file

``train`` loads the run file, applies the ``key=value`` overrides (dotted keys, YAML values,
as in OmegaConf's dotlist), checks everything (see :func:`~cadence.trainer.config.load_config`),
builds the Trainer (:func:`~cadence.trainer.build.build_trainer`) and calls ``fit()`` then
``close()``. A bad config prints every problem to stderr and exits with status 2, before
any model or data is built.

``launch`` checks the run file the same way, then starts ``N`` ranks with
``torch.distributed.run`` (torchrun), each running ``cadence train``. One node picks a free
port itself; several nodes pass ``--nnodes``, ``--node_rank``, ``--master_addr`` and
``--master_port`` as torchrun takes them. When a rank fails, torchrun stops the others and
prints the failing rank's traceback; the exit status is then 1.

More subcommands are added as a function ``_add_<name>(subparsers)`` each, registered in
:func:`build_parser`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence

__all__ = ["main", "build_parser"]

#: Exit status for a bad run config or bad arguments (argparse uses 2 for usage errors too).
EXIT_CONFIG_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    """The ``cadence`` argument parser, one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="cadence",
        description="Train PyTorch models from YAML run files (Composer-style events, "
                    "algorithms and callbacks).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(subparsers)
    _add_launch(subparsers)
    _add_convert(subparsers)
    return parser


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train",
        help="train from a YAML run file",
        description="Train from a YAML run file, with optional key=value overrides.",
        epilog="example: cadence train yamls/quickstart.yaml seed=3 model.n_layer=2 "
               "max_duration=100ba",
    )
    train.add_argument("config", metavar="RUN.yaml", help="the run file")
    train.add_argument(
        "overrides", nargs="*", metavar="key=value",
        help="override a config value with a dotted key and a YAML value, e.g. "
             "optimizer.lr=1e-3 or callbacks.lr_monitor={}",
    )
    train.set_defaults(func=_train_recorded)


def _add_launch(subparsers: argparse._SubParsersAction) -> None:
    launch = subparsers.add_parser(
        "launch",
        help="train on several ranks (a thin front on torchrun)",
        description="Check the run file, then start N ranks of `cadence train` with "
                    "torch.distributed.run (torchrun).",
        epilog="example: cadence launch -n 2 yamls/gpt_fsdp.yaml max_duration=20ba",
    )
    launch.add_argument("-n", "--nproc_per_node", type=int, required=True,
                        help="ranks (processes) on this node")
    launch.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    launch.add_argument("--node_rank", type=int, default=0, help="this node's rank (default 0)")
    launch.add_argument("--master_addr", default="127.0.0.1",
                        help="address of the rank-0 node (default 127.0.0.1)")
    launch.add_argument("--master_port", type=int, default=None,
                        help="port on the rank-0 node (default: a free port, on one node)")
    launch.add_argument("config", metavar="RUN.yaml", help="the run file")
    launch.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides, as for `cadence train`")
    launch.set_defaults(func=_launch)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(args: argparse.Namespace) -> int:
    from cadence.trainer.config import ConfigError, load_config

    if args.nproc_per_node < 1 or args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        print(f"cadence launch: need -n >= 1, --nnodes >= 1 and 0 <= --node_rank < --nnodes "
              f"(got -n {args.nproc_per_node}, --nnodes {args.nnodes}, --node_rank "
              f"{args.node_rank}).", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if args.nnodes > 1 and args.master_port is None:
        print("cadence launch: --master_port is required with --nnodes > 1 (every node must "
              "name the same rank-0 address and port).", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:  # fail on a bad run file before any rank starts
        load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"cadence launch: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    port = args.master_port if args.master_port is not None else _free_port()
    torchrun_args = get_args_parser().parse_args([
        f"--nproc_per_node={args.nproc_per_node}", f"--nnodes={args.nnodes}",
        f"--node_rank={args.node_rank}", f"--master_addr={args.master_addr}",
        f"--master_port={port}", "--max_restarts=0", "--monitor_interval=0.5",
        "-m", "cadence", "train", args.config, *args.overrides,
    ])
    try:
        run(torchrun_args)
    except ChildFailedError:
        return 1  # torchrun has printed the failing rank's traceback
    return 0


def _add_convert(subparsers: argparse._SubParsersAction) -> None:
    convert = subparsers.add_parser(
        "convert",
        help="export a checkpoint (to Hugging Face format, or to one full file)",
        description="Export a full or sharded checkpoint: --to hf writes model.safetensors, "
                    "config.json and the tokenizer for from_pretrained; --to full merges a "
                    "sharded checkpoint into one file.",
    )
    convert.add_argument("checkpoint", help="a full .pt file or a sharded checkpoint directory")
    convert.add_argument("--to", choices=("hf", "full"), required=True, help="output format")
    convert.add_argument("out", help="output directory (hf) or file (full)")
    convert.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cadence.trainer.checkpoint.checkpoint import CheckpointError
    from cadence.trainer.checkpoint.export import to_full, to_huggingface

    try:
        if args.to == "hf":
            out = to_huggingface(Path(args.checkpoint), Path(args.out))
        else:
            out = to_full(Path(args.checkpoint), Path(args.out))
    except CheckpointError as exc:
        print(f"cadence convert: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    # Imported when a run starts, not when the parser is built.
    from cadence.trainer.build import build_trainer
    from cadence.trainer.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
        trainer = build_trainer(cfg)
    except ConfigError as exc:
        print(f"cadence train: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        trainer.fit()
    finally:
        trainer.close()
    return 0


def _train_recorded(args: argparse.Namespace) -> int:
    """``_train`` under torchrun's ``@record`` when torchrun started this process: a failing
    rank writes its traceback to the error file torchrun reads, so the launcher shows it."""
    import os

    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return _train(args)
    from torch.distributed.elastic.multiprocessing.errors import record

    return int(record(_train)(args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``cadence`` command line.

    Args:
        argv: the arguments after the program name; default ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 2 for bad arguments or a bad run config.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return instead of exiting
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG_ERROR
    return int(args.func(args))
